"""Drafters on the field's standard sets at the field's settings: one `draftheads eval` run per (set, preset), every
drafter in each run (plain decoding, prompt lookup and the drafters interleaved prompt by prompt), gathered into one
table of tau and speedup per set and preset, and per MT-Bench category.

    .venv/bin/python -m benchmarks.standard_sets runs/peers/eagle3-draftheads runs/peers/eagle3-speculators \
        --sets humaneval:10,mt-bench:8 --presets specbundle-4,specbundle-8 --max-new-tokens 96 --out runs/standard

Writes <out>/<set>-<preset>/ (each run's own report) and <out>/standard_sets.md / .json. Run it with nothing else
heavy on the machine: the speedups are wall-clock ratios.

Every drafter is checked against every preset's tree before the first run: one that cannot draft that deep (a DFlash
block of 4 drafts 3 levels, specbundle-8 asks for 7) is left out of that preset's runs, and its row says why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftheads.core.tree import parse_tree
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.presets import PRESETS
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.interop.load import load_drafter
from draftheads.interop.native import FORMAT, read_config, resolve_drafter_folder, saved_head
from draftheads.measurement.drafter_specs import model_free, split_spec


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+", help="drafter or run folders")
    parser.add_argument("--sets", default="humaneval:10,mt-bench:8", help="NAME:LIMIT,... (LIMIT 0: the whole set)")
    parser.add_argument("--presets", default="specbundle-4,specbundle-8", help=f"any of {', '.join(PRESETS)}")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/standard")
    return parser.parse_args()


def draft_limits(drafters: list[str]) -> dict[str, int | None]:
    """How many levels each drafter spec drafts at most (None: prompt lookup and suffix decoding, any depth). Our
    own folders say it in their config; an engine's folder is read as the evaluation will read it, which needs the
    target, so the target is loaded only when such a folder is given."""
    model = None
    limits = {}
    for spec in drafters:
        path = split_spec(spec)[0]
        if model_free(path):
            limits[spec] = None
            continue
        folder = resolve_drafter_folder(path)
        config = read_config(folder)
        if config.get("format") == FORMAT:
            limits[spec] = saved_head(config, folder).depth
            continue
        model = model or load_eval_target(None, "auto", drafters)[0]
        limits[spec] = load_drafter(folder, model).config.depth
    return limits


def fitting(drafters: list[str], limits: dict[str, int | None], preset: str) -> tuple[list[str], dict[str, str]]:
    """(the drafters that can draft `preset`'s tree, why each other one cannot)."""
    depth = parse_tree(PRESETS[preset].tree).depth
    too_shallow = {spec: f"drafts at most {limits[spec]} levels, {preset} is {depth} deep" for spec in drafters
                   if limits[spec] is not None and limits[spec] < depth}
    return [spec for spec in drafters if spec not in too_shallow], too_shallow


def main() -> None:
    args = arguments()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    presets = args.presets.split(",")
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown preset {', '.join(unknown)}; use any of {', '.join(PRESETS)}")
    limits = draft_limits(list(args.drafters))
    plan = {preset: fitting(list(args.drafters), limits, preset) for preset in presets}
    for preset, (_, skipped) in plan.items():
        for spec, why in skipped.items():
            print(f"standard_sets: {spec} is left out of {preset}: it {why}", flush=True)
    rows = []
    for item in args.sets.split(","):
        name, _, limit = item.partition(":")
        limit = int(limit) if limit and int(limit) > 0 else None
        for preset in presets:
            kept, skipped = plan[preset]
            rows += [{"set": name, "prompts": None, "preset": preset, "kind": "all", "drafter": spec,
                      "tree": PRESETS[preset].tree, "tau": None, "speedup": None, "note": f"not run: it {why}"}
                     for spec, why in skipped.items()]
            if not kept:
                continue
            config = EvalConfig(prompts=name, limit=limit, preset=preset,
                                max_new_tokens=args.max_new_tokens)
            folder = run_eval(kept, config, out=str(out / f"{name}-{preset}"))
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
              f"{r['speedup']:.2f}x |" if r["tau"] is not None else
              f"| {r['set']} | {r['preset']} | {r['kind']} | - | {r['drafter']} | {r['note']} | - |" for r in rows]
    (out / "standard_sets.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
