"""Peers at equal budget: our EAGLE-3 trainer beside speculators' own EAGLE-3 trainer, on the same target-generated
rows for the same CPU minutes, both drafters then evaluated in one `draftheads eval` run (same prompts, tree, greedy).

    .venv/bin/python -m benchmarks.peers                                     # data/demo-self, 10 minutes each
    .venv/bin/python -m benchmarks.peers --data data/smollm2-self --minutes 35 --limit 20 --tree dynamic:6,5,24
    .venv/bin/python -m benchmarks.peers --skip-train                        # evaluate the runs under --out again

1. Ours: the eagle3-smollm2 recipe's head (1 Llama layer, ttt_steps 3, an 8,192-token draft vocabulary), trained
   offline by cpu_training.train_for_minutes (the benchmarks' CPU shape: batch 16 rows of <= 512 tokens, lr 1e-3
   constant after 20 warm-up steps) for --minutes. Its run folder: <out>/eagle3-draftheads (a rerun resumes it;
   benchmarks/block_parallel.py trains the same one when its --runs is this --out).
2. The same rows for speculators (speculators_data.py): the same token ids and loss masks, cut to the same 512
   tokens, our training rows first and our held-out rows last (so speculators' train/val split is ours); the
   hidden states computed by our target code from the SAME three layers (our feature_layers: the outputs of layers
   {1, N//2-1, N-4}, i.e. hidden_states {2, N//2, N-3}, which is also speculators' default target_layer_ids
   [2, N//2, N-3]: both name hidden_states indices, the input of that layer), plus the last layer before the final
   norm (speculators applies the target's norm itself). The draft vocabulary is ours: d2t.npy / t2d.npy of our run.
3. Theirs: speculators 0.9.0's trainer (speculators.train.cli.main) in .venv-speculators, through
   peer_runners/speculators_train.py (its CPU patches and the time stop), for --minutes of wall clock. Our draft
   architecture where its flags allow it (1 Llama layer, --no-norm-before-residual, --no-norm-before-fc,
   --no-norm-output: what our EAGLE-3 and engines' loaders run; ttt steps 3; our draft vocabulary and layers);
   their own defaults for the rest: Muon + AdamW at lr 1e-3, linear schedule over 20 epochs with 1% warm-up, KL
   loss, every ttt step weighted 1.0, packed batches of 8,192 tokens (--speculators-seq-len), bf16 autocast. CPU
   settings: sdpa attention (flex attention has no CPU backward), the eager loss (the fused one needs Triton), no
   data-loader workers (their 12 spawned ones on 2 cores). With sdpa a packed batch costs its whole square of
   attention (flex attention skips the blocks across rows): on 2 cores their tokens/s was 199 at 8,192 tokens a
   batch, 487 at 2,048 and 533 at 512 (ours: 967, batches of 16 rows of <= 512 tokens).
4. Their checkpoint (interrupted/ or the last epoch's) is copied as it is to <out>/eagle3-speculators/ and loaded
   by our speculators reader in the same `draftheads eval` run as ours, beside the prompt-lookup baseline.
   Both trainers are judged by the drafter they hold when the minutes run out: our final/, not best/ (the step
   with the best held-out acceptance, which benchmarks/block_parallel.py evaluates), since speculators' trainer
   keeps no best step of its own.

Prints trainer, minutes, steps, training tokens/s (non-padding tokens per second of training steps), tau and speedup;
writes them to <out>/peers.json and <out>/peers.md. Needs .venv-speculators (`make speculators-venv`) and the data
folder (`draftheads data demo-smollm2 data.output=data/demo-self`). Run it with nothing else heavy on the machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import yaml

from benchmarks.cpu_training import EAGLE3_RUN, recipe_drafter, train_for_minutes
from benchmarks.speculators_data import write_speculators_data
from draftheads.core.run_folder import FINAL, RECIPE_FILE, list_checkpoints
from draftheads.core.targets import locate_target
from draftheads.data.datastore import load_rows, prompt_groups
from draftheads.data.target import load_target
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.interop.load import load_drafter
from draftheads.interop.vocab_mapping import write_vocab_mappings
from draftheads.recipe import load_recipe
from draftheads.training.batches import split_rows

HERE = Path(__file__).resolve().parent
SPECULATORS_PYTHON = HERE.parent / ".venv-speculators" / "bin" / "python"
OURS, THEIRS = EAGLE3_RUN, "eagle3-speculators"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/demo-self", help="a finished `draftheads data` folder")
    parser.add_argument("--recipe", default="demo-smollm2", help="the recipe whose data section made --data")
    parser.add_argument("--minutes", type=float, default=10.0, help="training minutes for each trainer")
    parser.add_argument("--out", default="runs/peers", help="run folders, speculators' data, the report")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--tree", default=None, help="the one tree of every drafter (default: the eagle3-smollm2 "
                                                     "recipe's default_tree, which ours was trained with)")
    parser.add_argument("--speculators-seq-len", type=int, default=8192,
                        help="tokens per packed speculators batch (their --total-seq-len; 8192 is their default)")
    parser.add_argument("--skip-train", action="store_true", help="evaluate the runs already under --out")
    return parser.parse_args()


def train_ours(args, out: Path) -> dict:
    """Our EAGLE-3 for --minutes; its final/metrics.json (steps, train_seconds, train_tokens_per_s)."""
    head, train = recipe_drafter("eagle3-smollm2")
    data = {**load_recipe(args.recipe).to_dict()["data"], "output": args.data}
    run = out / OURS if args.skip_train else train_for_minutes(OURS, head, data, args.minutes, out, train=train)
    metrics = json.loads((run / FINAL / "metrics.json").read_text())
    return {"trainer": "draftheads", "drafter": str(run), "steps": metrics["steps"],
            "minutes": metrics["train_seconds"] / 60, "train_tokens_per_s": metrics["train_tokens_per_s"]}


def export_rows(run: Path, data_dir: str, folder: Path) -> tuple[dict, float]:
    """Our run's rows, layers and draft vocabulary as speculators' data in `folder`; (flags naming them, the
    train_data_ratio that makes speculators' split ours)."""
    recipe = yaml.safe_load((list_checkpoints(run)[-1] / RECIPE_FILE).read_text())
    train = recipe["train"]
    target, _ = load_target(recipe["target"]["name"], dtype=train["dtype"], device="cpu")
    drafter = load_drafter(run, target)
    layers = list(drafter.feature_layers[:3])  # hidden_states indices (our feature_layers + 1), the last is -1
    rows = load_rows(data_dir)
    train_idx, eval_idx = split_rows(len(rows), train["eval_fraction"], train["seed"], prompt_groups(rows))
    if folder.exists():
        shutil.rmtree(folder)
    print(f"peers: writing {len(rows)} rows with hidden_states {layers} + the last layer to {folder}", flush=True)
    write_speculators_data(target, rows, np.concatenate([train_idx, eval_idx]), layers, folder,
                           max_length=train["max_length"])
    write_vocab_mappings(folder, drafter.vocab.d2t.cpu(), target.config.vocab_size)
    flags = {"--verifier-name-or-path": locate_target(recipe["target"]["name"])[0], "--data-path": str(folder),
             "--target-layer-ids": [str(layer) for layer in layers],
             "--draft-vocab-size": str(drafter.vocab.size), "--d2t-path": str(folder / "d2t.npy"),
             "--t2d-path": str(folder / "t2d.npy")}
    return flags, (len(train_idx) + 0.5) / len(rows)  # int(n * ratio) = len(train_idx)


def speculators_command(flags: dict, ratio: float, run: Path, minutes: float, seq_len: int) -> list[str]:
    """The runner's command line: their trainer's flags (see the module docstring for each choice)."""
    args = [str(SPECULATORS_PYTHON), str(HERE / "peer_runners" / "speculators_train.py"), "--minutes", str(minutes),
            "--metrics", str(run / "train_metrics.json"), "--", "--speculator-type", "eagle3",
            "--save-path", str(run / "checkpoints"), "--log-dir", str(run / "logs"), "--num-layers", "1",
            "--draft-arch", "llama", "--ttt-steps", "3", "--no-norm-before-residual", "--no-norm-before-fc",
            "--no-norm-output", "--train-data-ratio", f"{ratio:.10f}", "--on-missing", "raise",
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0",
            "--total-seq-len", str(seq_len)]
    for flag, value in flags.items():
        args += [flag, *value] if isinstance(value, list) else [flag, value]
    return args


def train_speculators(ours: Path, data_dir: str, minutes: float, out: Path, *, seq_len: int = 8192,
                      skip_train: bool = False) -> dict:
    """speculators' EAGLE-3 for `minutes` on the rows, layers and draft vocabulary of our run `ours`; its
    checkpoint copied to <out>/eagle3-speculators/ (benchmarks/training_choices.py calls it too). `out` absolute."""
    run = out / f"{THEIRS}-run"
    if not skip_train:
        flags, ratio = export_rows(ours, data_dir, out / "speculators-data")
        if run.exists():
            shutil.rmtree(run)  # their trainer resumes from a checkpoint folder it finds: start afresh
        run.mkdir(parents=True)
        print(f"peers: training speculators' EAGLE-3 for {minutes:g} minutes", flush=True)
        done = subprocess.run(speculators_command(flags, ratio, run, minutes, seq_len), cwd=run)
        if done.returncode != 0:
            raise SystemExit(f"speculators' trainer failed (exit {done.returncode}); its output is above")
    metrics = json.loads((run / "train_metrics.json").read_text())
    drafter = out / THEIRS
    if drafter.exists():
        shutil.rmtree(drafter)
    drafter.mkdir()
    for name in ("config.json", "model.safetensors"):  # as saved: the eval names it by this folder
        shutil.copy2(Path(metrics["checkpoint"]) / name, drafter / name)
    return {**metrics, "drafter": str(drafter)}


def table(trained: list[dict], results: list[dict]) -> list[dict]:
    """One row per drafter of the report: the trainer's numbers beside tau and speedup."""
    by_name = {Path(t["drafter"]).name: t for t in trained}
    rows = []
    for r in results:
        t = by_name.get(r["drafter"], {})
        rows.append({"drafter": r["drafter"], "trainer": t.get("trainer", "-"), "minutes": t.get("minutes"),
                     "steps": t.get("steps"), "train_tokens_per_s": t.get("train_tokens_per_s"), "tree": r["tree"],
                     "tau": r["tau"], "speedup": r["speedup"]})
    return rows


def markdown(rows: list[dict], args) -> str:
    def num(value, form):
        return "-" if value is None else format(value, form)

    lines = [f"{args.prompts} (first {args.limit}), greedy, {args.minutes:g} training minutes each on {args.data}",
             "", "| drafter | trainer | minutes | steps | train tokens/s | tree | tau | speedup |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    lines += [f"| {r['drafter']} | {r['trainer']} | {num(r['minutes'], '.1f')} | {num(r['steps'], 'd')} | "
              f"{num(r['train_tokens_per_s'], ',.0f')} | {r['tree']} | {num(r['tau'], '.2f')} | "
              f"{num(r['speedup'], '.2f')}x |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = arguments()
    if not SPECULATORS_PYTHON.is_file():
        raise SystemExit(f"{SPECULATORS_PYTHON} is missing: run `make speculators-venv` first")
    out = Path(args.out).resolve()  # their trainer runs in its own folder: every path it is given is absolute
    out.mkdir(parents=True, exist_ok=True)
    trained = [train_ours(args, out)]
    trained.append(train_speculators(out / OURS, args.data, args.minutes, out, seq_len=args.speculators_seq_len,
                                     skip_train=args.skip_train))
    args.tree = args.tree or load_recipe("eagle3-smollm2").head.default_tree  # theirs has none of its own
    config = EvalConfig(prompts=args.prompts, limit=args.limit, tree=args.tree, accept=["greedy"],
                        temperatures=[0.0])
    report = run_eval([t["drafter"] for t in trained], config, out=str(out / "eval"))
    results = json.loads((Path(report) / "report.json").read_text())["results"]
    rows = table(trained, results)
    (out / "peers.json").write_text(json.dumps({"settings": vars(args), "trained": trained, "rows": rows}, indent=2))
    text = markdown(rows, args)
    (out / "peers.md").write_text(text)
    print("\n" + text + f"-> {out / 'peers.json'}, {out / 'peers.md'}")


if __name__ == "__main__":
    main()
