"""DFlash, DSpark and P-EAGLE (block-parallel) beside EAGLE-3 at equal data and training minutes, and DFlash's block
sizes.

    .venv/bin/python -m benchmarks.block_parallel                              # demo data, 10 minutes each
    .venv/bin/python -m benchmarks.block_parallel --drafters eagle3,dflash,dspark,dspark-r0 --minutes 8
    .venv/bin/python -m benchmarks.block_parallel --data data/smollm2-self --minutes 35 --blocks 8
    .venv/bin/python -m benchmarks.block_parallel --prompts tasks --limit 16 --tree auto
    .venv/bin/python -m benchmarks.block_parallel --drafters eagle3,dflash --blocks 4 --runs runs/at-35 ...
    .venv/bin/python -m benchmarks.block_parallel --data data/smollm2-self --recipe eagle3-smollm2 --minutes 35 \
        --eagle3-run runs/choices35/depth-fastmtp+init-target      # training_choices' run of the same drafter
    .venv/bin/python -m benchmarks.block_parallel --drafters dspark --train-only ...   # one run now, evaluate later

Trains (or resumes, when a run folder holds a finished run of the same settings) one EAGLE-3 drafter (the
eagle3-smollm2 head and depth weights, or the finished run --eagle3-run names), one P-EAGLE drafter (the
peagle-smollm2 head), one DFlash drafter per block size (the dflash-smollm2 head), one DSpark drafter (the
dspark-smollm2 head) and, as `dspark-r0`, the same without its Markov head (rank 0: what the Markov head adds, every
other choice equal), and as `peagle-markov` P-EAGLE with DSpark's Markov head (head.markov_rank at DSpark's rank) on
the same target-generated data folder, each for the same CPU minutes at a constant learning rate after warm-up,
then evaluates all of them in one `draftheads eval` run
(timings interleaved: each prompt is decoded by every configuration before the next prompt), beside prompt lookup
and each learned drafter combined with it. Each drafter is its run's best/ one (the step whose held-out simulated
acceptance was highest, as a user would serve it; `--use final` takes the last step's): on small data the one-
forward drafters overfit before their minutes end. DSpark is evaluated twice, verifying whole chains and with
`head.verify: scheduled` (its confidence head cuts each chain where it stops paying for the verify time on this
machine: a copy of the folder with that setting). The held-out top-1 accuracy by depth of every run (its training
evaluation: DSpark's given the real previous token, as a verifier reaches a depth only when every earlier draft was
accepted) is printed first. The EAGLE-3 run is the one benchmarks/peers.py trains when both are given the same runs
folder (--runs here, --out there), so it is trained once for both. Prints tau, drafting and verify cost and speedup
per drafter. The data folder must exist (`draftheads data demo-smollm2 data.output=data/demo-self` makes the default
one, ~10 minutes). Run it with nothing else heavy on the machine: two cores are easily shared away.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from benchmarks.cpu_training import EAGLE3_RUN, recipe_drafter, train_for_minutes
from draftheads.core.run_folder import DRAFTER
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.recipe import load_recipe


def recipe_section(recipe: str, section: str) -> dict:
    """One section of a bundled recipe, so the drafters trained here are the ones the recipes train."""
    return load_recipe(recipe).to_dict()[section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/demo-self", help="a finished `draftheads data` folder")
    parser.add_argument("--recipe", default="demo-smollm2", help="the recipe whose data section made --data")
    parser.add_argument("--minutes", type=float, default=10.0, help="training minutes per drafter")
    parser.add_argument("--blocks", default="8", help="DFlash block sizes, comma-separated (e.g. 4,8,16)")
    parser.add_argument("--runs", default="runs/bench", help="where the run folders go (kept: reruns resume)")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per prompt (default: eval's)")
    parser.add_argument("--tree", default=None, help="one tree for every drafter (default: each drafter's own)")
    parser.add_argument("--out", default=None, help="report folder")
    parser.add_argument("--drafters", default="eagle3,peagle,dflash", help="which to train and evaluate")
    parser.add_argument("--use", choices=("best", "final"), default="best",
                        help="each run's best/ drafter (highest held-out simulated acceptance) or its last step's")
    parser.add_argument("--eagle3-run", default=None,
                        help="a finished run folder of the eagle3-smollm2 drafter on the same data and minutes, "
                             "evaluated instead of training one (training_choices' depth-fastmtp+init-target run)")
    parser.add_argument("--train-only", action="store_true",
                        help="train (or resume) the runs and stop: evaluate them later, every drafter in one run")
    args = parser.parse_args()
    if args.eagle3_run and not (Path(args.eagle3_run) / "final" / DRAFTER).is_dir():
        raise SystemExit(f"--eagle3-run {args.eagle3_run}: no finished run there (final/{DRAFTER} is missing)")
    data = {**recipe_section(args.recipe, "data"), "output": args.data}
    runs = Path(args.runs)
    wanted = args.drafters.split(",")
    kinds = ("eagle3", "peagle", "peagle-markov", "dflash", "dspark", "dspark-r0")
    if set(wanted) - set(kinds):
        raise SystemExit(f"--drafters {args.drafters}: choose from {', '.join(kinds)}")
    heads, train = {}, {}
    if "eagle3" in wanted and not args.eagle3_run:
        heads[EAGLE3_RUN], train[EAGLE3_RUN] = recipe_drafter("eagle3-smollm2")
    if "peagle" in wanted:
        heads["peagle"] = recipe_section("peagle-smollm2", "head")
    if "peagle-markov" in wanted:   # DSpark's fix on P-EAGLE's slots, at DSpark's rank
        heads["peagle-markov"] = {**recipe_section("peagle-smollm2", "head"),
                                  "markov_rank": recipe_section("dspark-smollm2", "head")["markov_rank"]}
    if "dflash" in wanted:
        dflash = recipe_section("dflash-smollm2", "head")
        heads.update({f"dflash-b{b}": {**dflash, "block_size": int(b)} for b in args.blocks.split(",") if b})
    if "dspark" in wanted:
        heads["dspark"] = recipe_section("dspark-smollm2", "head")
    if "dspark-r0" in wanted:
        heads["dspark-r0"] = {**recipe_section("dspark-smollm2", "head"), "markov_rank": 0,
                              "confidence_with_markov": False}
    trained = [train_for_minutes(name, head, data, args.minutes, runs, train=train.get(name))
               for name, head in heads.items()]
    if args.train_only:
        return
    if "eagle3" in wanted and args.eagle3_run:
        trained.insert(0, Path(args.eagle3_run))
    print_depth_accuracy(trained)
    folders = [run / args.use / DRAFTER if (run / args.use / DRAFTER).is_dir() else run for run in trained]
    folders = [str(f) for f in folders] + [str(scheduled_copy(f)) for f in folders if head_kind(f) == "dspark"]
    config = EvalConfig(prompts=args.prompts, limit=args.limit, tree=args.tree, combined="graft",
                        **({"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}))
    report = run_eval(folders, config, out=args.out)
    rows = json.loads((Path(report) / "report.json").read_text())["results"]
    print(f"{args.prompts} (first {args.limit}), greedy, {args.minutes:g} training minutes each on {args.data}:")
    for row in rows:
        print(f"  {row['drafter']:28s} {row['tree']:22s} tau {row['tau']:.2f}  draft {row['draft_cost'] or 0:.2f}x  "
              f"verify {row['verify_cost'] or 0:.2f}x  speedup {row['speedup'] or 0:.2f}x")


def head_kind(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["head"]["type"]


def scheduled_copy(folder: Path) -> Path:
    """A copy of a DSpark drafter folder that verifies by confidence (`head.verify: scheduled`)."""
    copy = folder.parent / (folder.name + "-scheduled")
    if copy.exists():
        shutil.rmtree(copy)   # this script's own copy from an earlier run
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["head"]["verify"] = "scheduled"
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    return copy


def print_depth_accuracy(runs: list[Path]) -> None:
    """Each run's held-out top-1 accuracy by depth at its best step (its training evaluation)."""
    print("held-out top-1 accuracy by depth (training evaluation, best step):")
    for run in runs:
        metrics = json.loads((run / "final" / "metrics.json").read_text())
        evals = [h for h in metrics.get("eval_history", []) if "acc" in h] or [metrics["final_eval"]]
        best = max(evals, key=lambda e: e.get("accept_len", 0.0))
        print(f"  {run.name:28s} step {best.get('step', '?'):>5}  " + " / ".join(f"{a:.2f}" for a in best["acc"]))


if __name__ == "__main__":
    main()
