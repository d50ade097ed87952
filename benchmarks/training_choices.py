"""Training choices side by side: the eagle3-smollm2 drafter trained with each loss, depth weighting, initialisation,
unroll mode and data choice alone, every one from the same rows for the same CPU minutes, then all evaluated in one
interleaved run per prompt set and tree.

    .venv/bin/python -m benchmarks.training_choices                               # demo data, 12 minutes each
    .venv/bin/python -m benchmarks.training_choices --minutes 5 --limit 4 --max-new-tokens 64
    .venv/bin/python -m benchmarks.training_choices --choices default,lk_alpha --data data/smollm2-self --minutes 35
    .venv/bin/python -m benchmarks.training_choices --data2 data/demo-self-x2     # adds `two-answers`
    .venv/bin/python -m benchmarks.training_choices --choices default,depth-fastmtp+init-target --speculators

Each choice is one setting changed against the default (the eagle3-smollm2 head with every choice unset, the heads'
own behaviour, and the benchmarks' CPU training shape, benchmarks/cpu_training.py; the bundled recipes themselves now
train `depth-fastmtp+init-target`, docs/training-choices.md): `default` and `default-seed1` (the same, another seed:
the spread a difference must beat), the token losses of train.loss (`ce`, `rkl`, `jsd`, `tv`, `lk_alpha`, `lk_lambda`;
the default is `kl`), train.depth_weights (`depth-uniform`, `depth-fastmtp`, `depth-reach`; the default is ttt_decay
0.8^j), head.init (`init-target`), head.ttt_mode (`harmonised`), and with --data2 (a folder of the same prompts
answered twice, made by the recipe with data.samples_per_prompt=2) `two-answers`. Choices joined by `+` combine their
settings (`depth-fastmtp+init-target`, `depth-fastmtp+init-target+default-seed1`). --speculators adds speculators' own
EAGLE-3 trainer (benchmarks/peers.py's run of it) on the same rows, layers and draft vocabulary for the same minutes.
Training is offline, so every run on one data folder reads one shared feature cache (<data>/features/<key>). Each
drafter is its run's final/ one (what the minutes made).

Evaluation: `draftheads eval` on every drafter at once (each prompt decoded by every drafter before the next prompt)
for each of HumanEval (first --limit) and MT-Bench (first --mt-limit questions, both turns), on SpecForge's
specbundle-4 chain (chain:3) and on the eagle3-smollm2 recipe's tree (`own`: every choice's own tree, and the one
speculators' drafter, which has none, is given), greedy. Prints held-out top-1 accuracy by depth (the
training evaluation), then per set and tree tau, acceptance by depth, tokens/s and speedup; writes choices.json to
--runs. The data folder must exist (`draftheads data demo-smollm2 data.output=data/demo-self`, ~10 minutes). Run it
with nothing else heavy on the machine: two cores are easily shared away.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.block_parallel import recipe_section
from benchmarks.cpu_training import train_for_minutes
from benchmarks.peers import SPECULATORS_PYTHON, train_speculators
from draftheads.core.run_folder import DRAFTER
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval

# choice -> (head settings, train settings) changed against the default
CHOICES = {
    "default": ({}, {}),
    "default-seed1": ({}, {"seed": 1}),
    **{loss: ({}, {"loss": loss}) for loss in ("ce", "rkl", "jsd", "tv", "lk_alpha", "lk_lambda")},
    **{f"depth-{w}": ({}, {"depth_weights": w}) for w in ("uniform", "fastmtp", "reach")},
    "init-target": ({"init": "target_layer"}, {}),
    "harmonised": ({"ttt_mode": "harmonised"}, {}),
    "two-answers": ({}, {}),  # the default on --data2
}
TREES = {"specbundle-4": "chain:3", "own": recipe_section("eagle3-smollm2", "head")["default_tree"]}
SETS = ("humaneval", "mt-bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/demo-self", help="a finished `draftheads data` folder")
    parser.add_argument("--data2", default=None, help="the same prompts answered twice (data.samples_per_prompt=2)")
    parser.add_argument("--recipe", default="demo-smollm2", help="the recipe whose data section made --data")
    parser.add_argument("--minutes", type=float, default=12.0, help="training minutes per choice")
    parser.add_argument("--runs", default="runs/choices", help="where the run folders go (kept: reruns resume)")
    parser.add_argument("--choices", default=None, help="comma-separated (default: all; two-answers needs --data2)")
    parser.add_argument("--limit", type=int, default=10, help="HumanEval prompts")
    parser.add_argument("--mt-limit", type=int, default=8, help="MT-Bench questions (both turns each)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per turn (default: eval's)")
    parser.add_argument("--trees", default=",".join(TREES), help=f"comma-separated, of {', '.join(TREES)}")
    parser.add_argument("--speculators", action="store_true",
                        help="also speculators' EAGLE-3 trainer for the same minutes (needs .venv-speculators and "
                             "the `default` choice, whose rows, layers and draft vocabulary it is given)")
    parser.add_argument("--speculators-seq-len", type=int, default=2048,
                        help="tokens per packed speculators batch (2048: docs/benchmarks.md's peers runs)")
    args = parser.parse_args()
    wanted = args.choices.split(",") if args.choices else [c for c in CHOICES if c != "two-answers" or args.data2]
    parts = {part for name in wanted for part in name.split("+")}
    if parts - set(CHOICES) or ("two-answers" in parts and not args.data2):
        raise SystemExit(f"--choices: choose from {', '.join(CHOICES)}, or join them with + "
                         "(two-answers with --data2)")
    trees = args.trees.split(",")
    if set(trees) - set(TREES):
        raise SystemExit(f"--trees: choose from {', '.join(TREES)}")
    if args.speculators and ("default" not in wanted or not SPECULATORS_PYTHON.is_file()):
        raise SystemExit("--speculators: add `default` to --choices and build .venv-speculators (make "
                         "speculators-venv)")
    data = {**recipe_section(args.recipe, "data"), "output": args.data}
    # the baseline is every choice unset (the heads' own behaviour), whatever the recipe now sets: the recipe's
    # head.init is itself one of the choices (`depth-fastmtp+init-target` is what the bundled recipes train with)
    head = {key: value for key, value in recipe_section("eagle3-smollm2", "head").items() if key != "init"}
    runs = Path(args.runs)
    trained = {}
    for name in wanted:
        head_more, train_more = combined(name)
        folder = {**data, "output": args.data2, "samples_per_prompt": 2} if "two-answers" in name else data
        trained[name] = train_for_minutes(name, {**head, **head_more}, folder, args.minutes, runs, train=train_more)
    results = {"minutes": args.minutes, "data": args.data, "held_out": held_out(trained), "eval": {}}
    folders = [str(run / "final" / DRAFTER) for run in trained.values()]
    if args.speculators:
        theirs = train_speculators(trained["default"].resolve(), args.data, args.minutes, runs.resolve(),
                                   seq_len=args.speculators_seq_len)
        results["speculators"] = {k: theirs[k] for k in ("steps", "minutes", "train_tokens_per_s")}
        folders.append(theirs["drafter"])
    for prompts in SETS:
        for tree_name in trees:
            tree = TREES[tree_name]
            limit = args.limit if prompts == "humaneval" else args.mt_limit
            config = EvalConfig(prompts=prompts, limit=limit, tree=tree, accept=["greedy"],
                                **({"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}))
            report = run_eval(folders, config, out=str(runs / f"eval-{prompts}-{tree_name}"))
            rows = json.loads((Path(report) / "report.json").read_text())["results"]
            results["eval"][f"{prompts} {tree_name}"] = [summary(row) for row in rows]
    (runs / "choices.json").write_text(json.dumps(results, indent=2))
    print_results(results, args)


def combined(name: str) -> tuple[dict, dict]:
    """The head and train settings of a choice, or of choices joined by `+` (later parts win on a shared key)."""
    head, train = {}, {}
    for part in name.split("+"):
        head_more, train_more = CHOICES[part]
        head, train = {**head, **head_more}, {**train, **train_more}
    return head, train


def held_out(trained: dict) -> dict:
    """Each run's held-out top-1 accuracy by depth and simulated acceptance length at its last step, and its steps."""
    out = {}
    for name, run in trained.items():
        metrics = json.loads((run / "final" / "metrics.json").read_text())
        final = metrics["final_eval"] or metrics["eval_history"][-1]
        out[name] = {"steps": metrics["steps"], "acc": final["acc"], "accept_len": final["accept_len"]}
    return out


def summary(row: dict) -> dict:
    return {"drafter": row["drafter"], "tree": row["tree"], "tau": row["tau"], "acceptance": row["acceptance_rates"],
            "tokens_per_s": row["tokens_per_s_spec"], "plain_tokens_per_s": row["tokens_per_s_plain"],
            "speedup": row["speedup"]}


def print_results(results: dict, args) -> None:
    print(f"training choices, {args.minutes:g} minutes each on {args.data}; held-out top-1 by depth:")
    for name, h in results["held_out"].items():
        print(f"  {name:16s} steps {h['steps']:>5}  accept_len {h['accept_len']:.3f}  "
              + " / ".join(f"{a:.3f}" for a in h["acc"]))
    if "speculators" in results:
        t = results["speculators"]
        print(f"  speculators'     steps {t['steps']:>5}  ({t['minutes']:.1f} min, {t['train_tokens_per_s']:,.0f} "
              "training tokens/s; its own held-out figures are not comparable)")
    for key, rows in results["eval"].items():
        print(f"{key} (greedy):")
        for r in rows:
            depth = "/".join(f"{a:.2f}" for a in (r["acceptance"] or [])[:4])
            print(f"  {r['drafter']:16s} {r['tree']:18s} tau {r['tau']:.3f}  accept {depth:19s} "
                  f"{r['tokens_per_s'] or 0:5.1f} tok/s  speedup {r['speedup'] or 0:.2f}x")


if __name__ == "__main__":
    main()
