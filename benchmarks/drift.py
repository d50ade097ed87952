"""What updating the target does to its EAGLE-3 drafter, and what keeping the drafter current costs.

    .venv/bin/python -m benchmarks.drift shift      # updated targets made (cached), the drafter's drift on each
    .venv/bin/python -m benchmarks.drift recover    # warm start vs scratch on the most shifted target
    .venv/bin/python -m benchmarks.drift monitor    # the retrain rule on llama-server, original vs updated targets

`shift` makes the updated targets from the embedded SmolLM2 (cached under targets/): full fine-tunes and LoRA
fine-tunes at two strengths each on data/update-writing (the target's own sampled answers to writing, role-play,
open and humanities prompts: another kind of data than the drafter's mostly-code rows; `draftheads data
demo-smollm2 data.output=data/update-writing ...` as docs/drift.md gives it), and the embedded GGUF requantized from
Q4_1 to Q4_0. Then `draftheads drift` of the drafter (runs/bench/eagle3-draftheads by default: EAGLE-3, 12 minutes on
the demo data) on each, its old-target evaluation measured once and shared. Prints shift, tau old/new and predicted
per target.

`recover` regenerates the drafter's training data with the updated target (the same prompts, answered by the new
target; all of them and a quarter) and trains: from scratch (12 minutes), warm from the old drafter (6 minutes, on
all the new rows, on a quarter of them, and on the OLD rows with the new target's features: no regeneration). Every
checkpoint's tau on the new target is measured on the same prompts (batched greedy decoding, one run per
checkpoint), beside its held-out accuracy from the training log. Prints tau per training minute and the minutes each
needs to reach 95% of the tau the scratch drafter ends at. Run it with nothing else heavy on the machine.

`monitor` serves the drafter (exported to GGUF) in llama-server: on the original target for a baseline (HumanEval
prompts 1-10), then on the original, the requantized and the most shifted updated target (converted to GGUF) for
prompts 11-30, the retrain rule reading llama-server's /metrics after every request. Prints each run's acceptance
and the request at which the rule fired.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.cpu_training import train_for_minutes
from draftheads.core.targets import embedded_gguf
from draftheads.data.chat import first_messages, render_ids, stop_token_ids
from draftheads.data.datagen import run_data
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import load_source
from draftheads.data.target import load_target
from draftheads.decoding.generate import speculative_generate
from draftheads.drift.acceptance_monitor import RetrainRule, serve_monitored
from draftheads.drift.drift import run_drift
from draftheads.drift.target_update import UpdateConfig, update_target
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.plots import save
from draftheads.interop.export import export_drafter
from draftheads.interop.gguf_targets import convert_to_gguf, requantize_gguf
from draftheads.interop.llama_cpp_build import install_llama_cpp
from draftheads.interop.load import load_drafter
from draftheads.recipe import load_recipe

UPDATES = {"full-12-2e-5": UpdateConfig(method="full", steps=12, lr=2e-5),
           "full-12-1e-4": UpdateConfig(method="full", steps=12, lr=1e-4),
           "full-12-5e-4": UpdateConfig(method="full", steps=12, lr=5e-4),
           "lora-12-2e-4": UpdateConfig(method="lora", steps=12, lr=2e-4),
           "lora-12-1e-3": UpdateConfig(method="lora", steps=12, lr=1e-3)}


def make_targets(data: str, folder: Path) -> dict[str, str]:
    targets = {name: str(update_target(data, folder / name, config)) for name, config in UPDATES.items()}
    q4 = folder / "q4_0" / "smollm2-135m-q4_0.gguf"
    if not q4.is_file():
        requantize_gguf(embedded_gguf("smollm2-135m"), q4, "q4_0")
    return {"q4_0": str(q4), **targets}


def shift(args) -> None:
    targets = make_targets(args.update_data, Path(args.targets))
    config = EvalConfig(prompts=args.prompts, limit=args.limit, max_new_tokens=args.max_new_tokens)
    out = Path(args.out)
    old = out / "old"
    if not (old / "report.json").is_file():
        run_eval([args.drafter], config, out=str(old))
    lines, points = [], []
    for name, target in targets.items():
        folder = out / name
        if not (folder / "report.json").is_file():   # kept: a rerun measures only the targets added since
            run_drift(args.drafter, target, config, out=str(folder), old_report=str(old))
        report = json.loads((folder / "report.json").read_text())
        row = next(r for r in report["rows"] if r["tau_predicted"] is not None)
        lookup = next(r for r in report["rows"] if r["tau_predicted"] is None)
        s = report["shift"]
        points.append((name, s["agreement"], row["tau_old"], row["tau_new"], row["tau_predicted"]))
        lines.append(f"  {name:14s} agreement {s['agreement']:.3f}  KL {s['kl']:.3f}  tau {row['tau_old']:.2f} -> "
                     f"{row['tau_new']:.2f} (predicted {row['tau_predicted']:.2f}, drop "
                     f"{1 - row['tau_new'] / row['tau_old']:.0%})  speedup {row['speedup_old']:.2f}x -> "
                     f"{row['speedup_new']:.2f}x  lookup tau {lookup['tau_old']:.2f} -> {lookup['tau_new']:.2f}")
    print(f"{args.drafter} on updated targets, {args.prompts} (first {args.limit}), {args.max_new_tokens} tokens, "
          "greedy:")
    print("\n".join(lines))
    plot_shift(points, out / "tau_vs_shift.png")


def recover(args) -> None:
    target, runs, data_root = args.target, Path(args.runs), Path("data")
    prompts = str(Path(args.old_data) / "prompts.jsonl")
    name = Path(target).stem
    new_all = regenerate(target, prompts, data_root / f"drift-{name}", None)
    new_part = regenerate(target, prompts, data_root / f"drift-{name}-quarter", 100)
    old_drafter = str(Path(args.drafter) / "final" / "drafter")
    variants = {"scratch": (new_all, None, args.minutes), "warm": (new_all, old_drafter, args.minutes / 2),
                "warm-quarter": (new_part, old_drafter, args.minutes / 2),
                "warm-old-rows": (args.old_data, old_drafter, args.minutes / 2)}
    model, tokenizer = load_target(target)
    conversations = eval_prompts(tokenizer, args.prompts, args.limit)
    old_tau = tau_of(load_drafter(old_drafter, model), model, tokenizer, conversations, args.max_new_tokens)
    curves = {}
    for variant, (data, init, minutes) in variants.items():
        run = train(f"{Path(target).stem}-{variant}", data, init, minutes, runs, target)
        start = [{"step": 0, "minutes": 0.0, "acc": float("nan"), "tau": old_tau}] if init else []
        curves[variant] = start + curve(run, model, tokenizer, conversations, args.max_new_tokens)
    (runs / "recover.json").write_text(json.dumps({"target": target, "old_tau": old_tau, "curves": curves}, indent=1))
    plot_recovery(curves, old_tau, runs / "recovery.png")
    goal = 0.95 * curves["scratch"][-1]["tau"]
    print(f"recovery on {target}: tau of the old drafter {old_tau:.2f}; scratch ends at "
          f"{curves['scratch'][-1]['tau']:.2f} (95%: {goal:.2f}); {args.prompts} first {args.limit}, "
          f"{args.max_new_tokens} tokens, greedy")
    for name, points in curves.items():
        reached = next((p["minutes"] for p in points if p["tau"] >= goal), None)
        cells = "  ".join(f"{p['minutes']:.1f}m {p['tau']:.2f}/{p['acc']:.2f}" for p in points)
        print(f"  {name:14s} 95% at {'never' if reached is None else f'{reached:.1f} min':9s} tau/acc1: {cells}")


def monitor(args) -> None:
    targets = make_targets(args.update_data, Path(args.targets))
    out = Path(args.out).parent / "monitor"
    drafter = out / "drafter" / "drafter.gguf"
    if not drafter.is_file():
        export_drafter(args.drafter, "llama.cpp", out / "drafter", overwrite=True)
    updated = Path(args.served_update)
    updated_gguf = updated / "model-bf16.gguf"
    if not updated_gguf.is_file():
        convert_to_gguf(updated, updated_gguf, "bf16")
    server = install_llama_cpp().server
    _, tokenizer = load_target("smollm2-135m")
    prompts = eval_prompts(tokenizer, args.prompts, 30)
    original = embedded_gguf("smollm2-135m")
    _, baseline = serve_monitored(server, original, drafter, prompts[:10], RetrainRule(baseline=0.5),
                                  out / "baseline.log")
    rule = RetrainRule(baseline=baseline, tolerance=0.15, window=10, min_observations=8)
    print(f"baseline acceptance on {original.name}, {args.prompts} 1-10: {baseline:.3f}; threshold "
          f"{rule.threshold:.3f}; then {args.prompts} 11-30, window 10, 3 draft tokens, greedy:")
    for name, gguf in (("original", original), ("q4_0", Path(targets["q4_0"])), (updated.name, updated_gguf)):
        watched, rate = serve_monitored(server, gguf, drafter, prompts[10:], rule, out / f"{name}.log")
        fired = "never" if watched.fired_at is None else f"at request {watched.fired_at}"
        print(f"  {name:14s} acceptance {rate:.3f}  retrain rule fired {fired}")


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no window), chosen before pyplot is imported as
    evaluation/plots.py chooses it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_recovery(curves: dict, old_tau: float, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        ax.plot([p["minutes"] for p in points], [p["tau"] for p in points], marker="o", label=name)
    ax.axhline(old_tau, color="grey", linestyle=":", label="old drafter, untouched")
    ax.axhline(0.95 * curves["scratch"][-1]["tau"], color="black", linestyle="--", label="95% of scratch's end")
    ax.set_xlabel("training minutes (2 CPU cores)")
    ax.set_ylabel("tau on the updated target")
    ax.legend(fontsize=8)
    save(plt, fig, path)


def plot_shift(points: list[tuple[str, float, float, float, float]], path: Path) -> None:
    """tau measured and predicted on each updated target against its top-1 agreement with the old one."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, agreement, old, new, predicted in points:
        ax.scatter([agreement], [new], color="C0")
        ax.scatter([agreement], [predicted], color="C1", marker="x")
        ax.annotate(name, (agreement, new), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(points[0][2], color="grey", linestyle=":", label="tau on the old target")
    ax.scatter([], [], color="C0", label="measured")
    ax.scatter([], [], color="C1", marker="x", label="predicted from agreement")
    ax.set_xlabel("top-1 agreement of the updated target with the old one (drafter's training rows)")
    ax.set_ylabel("EAGLE-3 tau on the updated target")
    ax.legend(fontsize=8)
    save(plt, fig, path)


def regenerate(target: str, prompts: str, out: Path, count: int | None) -> str:
    """The old prompts answered by the new target, as the demo recipe answers them."""
    overrides = [f"target.name={target}", f"data.output={out}", f"data.prompts=[{{source: {prompts}}}]"]
    if count:
        overrides.append(f"data.num_prompts={count}")
    recipe = load_recipe("demo-smollm2", overrides)
    if not (out / "draftheads_data.json").is_file() or not json.loads(
            (out / "draftheads_data.json").read_text()).get("complete"):
        run_data(recipe)
    return str(out)


def train(name: str, data: str, init: str | None, minutes: float, runs: Path, target: str) -> Path:
    """EAGLE-3 as eagle3-smollm2 sets it (warm-started from `init`), on `data`, checkpointed often for the curve."""
    head = dict(load_recipe("eagle3-smollm2").to_dict()["head"], init_from=init)
    data_section = {**load_recipe("demo-smollm2").to_dict()["data"], "output": data}
    return train_for_minutes(name, head, data_section, minutes, runs, target=target, checkpoint_every=30,
                             keep_last=100)


def curve(run: Path, model, tokenizer, conversations, max_new_tokens: int) -> list[dict]:
    """tau on the new target and held-out top-1 accuracy at every checkpoint; minutes from the run's own step rate."""
    metrics = json.loads((run / "final" / "metrics.json").read_text())
    per_step = metrics["train_seconds"] / 60 / metrics["steps"]
    accuracy = {h["step"]: h["acc"][0] for h in metrics["eval_history"]}   # held-out rows, first depth
    points = []
    for step_dir in sorted(run.glob("step_*")):
        step = int(step_dir.name.split("_")[1])
        drafter = load_drafter(str(step_dir / "drafter"), model)
        points.append({"step": step, "minutes": step * per_step, "acc": accuracy.get(step, float("nan")),
                       "tau": tau_of(drafter, model, tokenizer, conversations, max_new_tokens)})
    return points


def eval_prompts(tokenizer, source: str, limit: int) -> list[list[int]]:
    prompts = load_source(PromptSource(source=source, limit=limit))
    return [render_ids(tokenizer, first_messages(p.turns[:1], p.system), add_generation_prompt=True)
            for p in prompts]


@torch.no_grad()
def tau_of(drafter, model, tokenizer, conversations, max_new_tokens: int) -> float:
    result = speculative_generate(model, drafter, conversations, max_new_tokens,
                                  eos_token_id=stop_token_ids(tokenizer, model.generation_config))
    return result.stats.tau


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["shift", "recover", "monitor"])
    parser.add_argument("--drafter", default="runs/bench/eagle3-draftheads",
                        help="the old target's drafter (a run folder)")
    parser.add_argument("--update-data", default="data/update-writing", help="what the updates are fine-tuned on")
    parser.add_argument("--old-data", default="data/demo-self", help="the drafter's training data")
    parser.add_argument("--targets", default="targets", help="where updated targets are made (kept)")
    parser.add_argument("--target", default="targets/q4_0/smollm2-135m-q4_0.gguf",
                        help="recover: the updated target (default: the most shifted one measured)")
    parser.add_argument("--served-update", default="targets/full-12-5e-4",
                        help="monitor: the fine-tuned update served beside the requantized one")
    parser.add_argument("--runs", default="runs/drift", help="recover: run folders (kept: reruns resume)")
    parser.add_argument("--minutes", type=float, default=12.0, help="recover: scratch minutes (warm: half)")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="runs/drift/shift", help="shift: report folders")
    args = parser.parse_args()
    {"shift": shift, "recover": recover, "monitor": monitor}[args.part](args)


if __name__ == "__main__":
    main()
