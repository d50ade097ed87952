"""Drafters on the field's standard sets at the field's settings: one `draftheads eval` run per (set, preset), every
drafter in each run (plain decoding, prompt lookup and the drafters interleaved prompt by prompt), gathered into one
table of tau and speedup per set and preset, and per MT-Bench category.

    .venv/bin/python benchmarks/standard_sets.py runs/peers/eagle3-draftheads runs/peers/eagle3-speculators \
        --sets humaneval:10,mt-bench:8 --presets specbundle-4,specbundle-8 --max-new-tokens 96 --out runs/standard

Writes <out>/<set>-<preset>/ (each run's own report) and <out>/standard_sets.md / .json. Run it with nothing else
heavy on the machine: the speedups are wall-clock ratios.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.presets import PRESETS


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+", help="drafter or run folders")
    parser.add_argument("--sets", default="humaneval:10,mt-bench:8", help="NAME:LIMIT,... (LIMIT 0: the whole set)")
    parser.add_argument("--presets", default="specbundle-4,specbundle-8", help=f"any of {', '.join(PRESETS)}")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/standard")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    out = Path(args.out)
    rows = []
    for item in args.sets.split(","):
        name, _, limit = item.partition(":")
        limit = int(limit) if limit and int(limit) > 0 else None
        for preset in args.presets.split(","):
            config = EvalConfig(prompts=name, limit=limit, preset=preset,
                                max_new_tokens=args.max_new_tokens)
            folder = run_eval(list(args.drafters), config, out=str(out / f"{name}-{preset}"))
            report = json.loads((Path(folder) / "report.json").read_text())
            for r in report["results"]:
                rows.append({"set": name, "prompts": report["prompt_count"], "preset": preset, "kind": "all",
                             "drafter": r["drafter"], "tree": r["tree"], "tau": r["tau"], "speedup": r["speedup"]})
            for r in report.get("by_kind", []):
                rows.append({"set": name, "prompts": r["task_prompts"], "preset": preset, "kind": r["task_kind"],
                             "drafter": r["drafter"], "tree": r.get("tree", ""), "tau": r["tau"],
                             "speedup": r["speedup"]})
    (out / "standard_sets.json").write_text(json.dumps({"settings": vars(args), "rows": rows}, indent=2))
    lines = ["| set | preset | kind | prompts | drafter | tau | speedup |", "|---|---|---|---:|---|---:|---:|"]
    lines += [f"| {r['set']} | {r['preset']} | {r['kind']} | {r['prompts']} | {r['drafter']} | {r['tau']:.2f} | "
              f"{r['speedup']:.2f}x |" for r in rows]
    (out / "standard_sets.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
