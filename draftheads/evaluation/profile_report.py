"""`draftheads profile TARGET [DRAFTER...]`: measure (or read from the cache) and show the machine's cost profile.

    folder = run_profile("smollm2-135m", ["runs/eagle-smollm2"])   # -> folder with profile.json, profile.png

Prints the target's verify-forward time by query tokens and context, in milliseconds and in plain decode steps
(what a tree of that many nodes costs to verify), each acceptance rule's own cost, and each drafter's cost
per step, per draft level and per node.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from pathlib import Path

from draftheads.costmodel.calibration import Calibration, profile_entry
from draftheads.costmodel.profile import TargetProfile, target_profile
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.plots import _pyplot, save
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.measurement.conversations import eval_settings, load_conversations
from draftheads.measurement.entries import build_entries

SHOWN_RULES = [("strict", 0.7, 0, 1.0), ("typical", 0.7, 0, 1.0), ("strict", 0.7, 0, 0.9)]


def run_profile(target: str | None, drafters: list[str], *, dtype: str = "auto", refresh: bool = False,
                out: str | None = None, target_model=None) -> Path:
    model, tokenizer, info = load_eval_target(target, dtype, drafters, target_model)
    profile = target_profile(model, refresh=refresh, rules=SHOWN_RULES, progress=lambda line: print(line, flush=True))
    entries = build_entries(drafters, model, None) if drafters else []   # prompt lookup comes with any drafter
    costs = {}
    if entries:
        config = EvalConfig(max_new_tokens=64)
        settings = eval_settings(model, tokenizer, config, max(e.nodes for e in entries))
        # profile_entry times a drafter on the first calibration prompt only: load that one, not the whole set
        calibration = load_conversations(config.prompts, 1, tokenizer, settings, 1)[2]
        for entry in entries:
            costs[entry.name] = profile_entry(Calibration(model, tokenizer, calibration, settings), entry)
    print(format_profile(profile, info["name"], info["dtype"], costs))
    folder = Path(out) if out else Path("runs") / f"profile-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profile.json").write_text(json.dumps(
        {"target": info, "profile": asdict(profile), "drafters": {k: asdict(v) for k, v in costs.items()}}, indent=1))
    plot_profile(folder / "profile.png", profile, info["name"])
    print(f"draftheads profile: {folder}/profile.json and profile.png", flush=True)
    return folder


def format_profile(profile: TargetProfile, name: str, dtype: str, costs: dict) -> str:
    key = profile.key
    lines = [f"target {name} ({dtype}, {key['device']}) on {key['cpu']}, {key['threads']} threads; measured "
             f"{profile.created}",
             "", "verify forward, ms (decode steps) by query tokens (columns) and cached context (rows):", "",
             "| context | " + " | ".join(str(q) for q in profile.queries) + " |",
             "|---|" + "---|" * len(profile.queries)]
    for context, row in zip(profile.contexts, profile.forward_s):
        step = profile.decode_step(context)
        cells = ["-" if t is None else f"{1e3 * t:.1f} ({t / step:.2f})" for t in row]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    lines += ["", "(context 0: a prefill of that many tokens)", "",
              "acceptance rules beyond the greedy pick, ms over 1 / 8 / 32 nodes:"]
    for setting, _ in profile.rule_s.items():
        lines.append(f"  {setting:28s} " + " / ".join(f"{1e3 * profile.rule(setting, n):.2f}" for n in (1, 8, 32)))
    if costs:
        lines += ["", "drafters, ms: step = base + per level x depth + per node x nodes; observe per prompt token:"]
        for drafter, c in costs.items():
            lines.append(f"  {drafter:20s} base {1e3 * c.base_s:.2f}  per level {1e3 * c.level_s:.2f}  "
                         f"per node {1e3 * c.node_s:.3f}  observe {1e3 * c.observe_s:.3f}")
    return "\n".join(lines)


def plot_profile(path: Path, profile: TargetProfile, name: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for context, row in zip(profile.contexts, profile.forward_s):
        if not context:
            continue
        step = profile.decode_step(context)
        points = [(q, t / step) for q, t in zip(profile.queries, row) if t is not None]
        ax.plot([q for q, _ in points], [v for _, v in points], marker="o", label=f"context {context}")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens verified in one forward (tree nodes)")
    ax.set_ylabel("time / one decode step")
    ax.set_title(f"verify cost on this machine: {name}")
    ax.legend()
    save(plt, fig, path)
