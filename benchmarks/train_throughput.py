"""Training tokens/s: padded (length-bucketed or not) vs packed batches, and 1 vs 2 processes, in one run.

    python -m benchmarks.train_throughput                         # EAGLE-3 on the demo's SmolLM2 data, online
    python -m benchmarks.train_throughput --modes online,offline --rounds 2 --steps 16
    python -m benchmarks.train_throughput --processes 1,2 --layouts bucketed

Every configuration is a fresh `draftheads train` of the same recipe for --steps optimizer steps, launched in
turn, round after round (configurations interleaved, so load from elsewhere hits them alike). Tokens/s counts
real tokens only (padding excluded) over training steps only (evaluation and checkpoints excluded): it is the
run's own `train_tokens_per_s`. Packed sequences hold up to train.max_length tokens; their count per step is
chosen so that a step holds about as many tokens as a padded step of train.batch_size rows.
Goal (issue 31): packing >= 1.3x the tokens/s of padded batches on the SmolLM2 data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from draftheads.data.datastore import load_rows

LAYOUTS = {"bucketed": ["train.bucket_by_length=true"], "unbucketed": ["train.bucket_by_length=false"],
           "packed": ["train.pack=true"]}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="eagle3-smollm2")
    parser.add_argument("--data", default="data/demo-self", help="a `draftheads data` folder of the recipe's target")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per padded step")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--modes", default="online")
    parser.add_argument("--layouts", default="bucketed,unbucketed,packed")
    parser.add_argument("--processes", default="1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="runs/bench/train-throughput")
    return parser.parse_args()


def packed_batch(data: str, rows_per_step: int, max_length: int) -> int:
    """Packed sequences per step holding about as many tokens as `rows_per_step` padded rows."""
    lengths = np.array([min(len(ids), max_length) for ids in load_rows(data).with_format(None)["input_ids"]])
    return max(1, round(rows_per_step * lengths.mean() / max_length))


def launch(args, mode: str, layout: str, processes: int, batch: int, folder: Path) -> float:
    overrides = [f"data.output={args.data}", f"train.output_dir={folder}", f"train.mode={mode}",
                 f"train.max_steps={args.steps}", f"train.batch_size={batch}", f"train.max_length={args.max_length}",
                 "train.time_budget_minutes=null", f"train.eval_every={args.steps}", f"train.save_every={args.steps}",
                 "train.warmup_steps=2", "log.trackers=[]", *LAYOUTS[layout]]
    if processes == 1:
        command = [sys.executable, "-m", "draftheads.train", args.recipe, *overrides]
        env = os.environ
    else:  # each process gets one core's share of threads, as a launcher on a cluster node would give it GPUs
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", "29591", "-m", "draftheads.train", args.recipe, *overrides]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{layout}/{mode}/{processes}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads((folder / "final" / "metrics.json").read_text())["train_tokens_per_s"]


def main() -> None:
    args = arguments()
    pack_batch = packed_batch(args.data, args.batch_size, args.max_length)
    configs = [(m, lay, int(p)) for m in args.modes.split(",") for lay in args.layouts.split(",")
               for p in args.processes.split(",")]
    rates: dict[tuple, list[float]] = {c: [] for c in configs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        for mode, layout, processes in configs:
            batch = pack_batch if layout == "packed" else args.batch_size
            batch = max(1, batch // processes)  # the same rows per optimizer step in all
            with tempfile.TemporaryDirectory(dir=out) as tmp:
                rate = launch(args, mode, layout, processes, batch, Path(tmp) / "run")
            rates[(mode, layout, processes)].append(rate)
            print(f"round {r + 1}: {mode:7s} {layout:10s} x{processes}  {rate:8,.0f} tokens/s", flush=True)
    print(f"\n{args.recipe} on {args.data}, {args.steps} steps, padded batch {args.batch_size} rows, packed batch "
          f"{pack_batch} x {args.max_length} tokens; median of {args.rounds} rounds")
    print(f"{'mode':8s} {'layout':11s} {'procs':>5s} {'tokens/s':>10s} {'vs bucketed x1':>15s}")
    for mode, layout, processes in configs:
        base = statistics.median(rates.get((mode, "bucketed", 1)) or [float("nan")])
        rate = statistics.median(rates[(mode, layout, processes)])
        print(f"{mode:8s} {layout:11s} {processes:>5d} {rate:>10,.0f} {rate / base:>14.2f}x")


if __name__ == "__main__":
    main()
