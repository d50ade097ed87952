"""`draftheads eval`: acceptance and real speedup of drafters against plain decoding of the same target.

    folder = run_eval(["runs/eagle-smollm2"], EvalConfig(accept=["greedy", "strict"], temperatures=[0.0, 0.7]))
    folder = run_eval(["runs/eagle-smollm2+lookup"], EvalConfig(batch_sizes=[1, 2, 4, 8, 16]))   # + speedup vs batch

Drafters are named by specs (measurement/drafter_specs.py). In order: the settings are checked (EvalConfig), the
target and drafters loaded, the prompts rendered as conversations; on the calibration prompts, automatic trees are
fitted, gates priced and each drafter's speedup predicted (costmodel/calibration.py, costmodel/forecast.py); then
every conversation is decoded plainly and by every drafter x rule, interleaved (measurement/measure.py), and the
report written (results.py, report.py).
"""

from __future__ import annotations

from pathlib import Path

from draftheads.core.tree import AutoTreeSpec
from draftheads.costmodel.batch_profile import batch_profile
from draftheads.costmodel.calibration import (COMB_DEPTH, COMB_WIDTH, Calibration, fit_auto_trees, price_gates,
                                              price_schedules)
from draftheads.costmodel.earlier_report import read_earlier
from draftheads.costmodel.forecast import predict_entries, prediction_columns
from draftheads.costmodel.profile import target_profile
from draftheads.data.hardware import environment
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.plots import write_plots
from draftheads.evaluation.report import SHORT_COLUMNS, format_batch_table, format_table, now, write_report
from draftheads.evaluation.report_folder import check_report_folder, report_folder
from draftheads.evaluation.results import build_rows, results_section
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.measurement.conversations import eval_settings, first_chat, load_conversations
from draftheads.measurement.entries import LOOKUP_DEPTH, build_entries, plain_above_entry
from draftheads.measurement.measure import measure, plan_configs

SEED_RULE = "seed + 1000 * prompt index + turn, same for plain and speculative"


def run_eval(drafters: list[str], config: EvalConfig | None = None, *, target: str | None = None,
             out: str | None = None, target_model=None, progress: bool = True) -> Path:
    """Measure every drafter x rule x temperature on the prompts; write and print the report; return its folder.

    target: the target spec (default: the one the first learned drafter was trained for); out: the report folder;
    target_model: (model, tokenizer) to use instead of loading the target (tests, the demo).
    """
    config = config or EvalConfig()
    check_report_folder(out, drafters)  # before minutes of work, not after
    earlier = read_earlier(config.tau_from) if config.tau_from else None
    requested = config.tree_spec
    budget = requested.budget if isinstance(requested, AutoTreeSpec) else None
    model, tokenizer, target_info = load_eval_target(target, config.dtype, drafters, target_model,
                                                     chat_template=config.chat_template, device=config.device)
    entries = build_entries(drafters, model, None if budget else requested, config.combined_modes)
    configs = plan_configs(config.accept, config.temperatures)
    # room for the biggest tree a step verifies: the drafters' own, or what fitting an automatic tree may try
    fitted = max(budget + 1 + LOOKUP_DEPTH, COMB_WIDTH * COMB_DEPTH + 1) if budget else 1
    settings = eval_settings(model, tokenizer, config, max([e.nodes for e in entries] + [fitted]))
    conversations, skipped, calibration = load_conversations(config.prompts, config.limit, tokenizer, settings,
                                                             config.calibration_prompts)
    rules = {(c.rule, c.temperature) for c in configs} | {("strict", c.temperature) for c in configs}
    profile = target_profile(model, refresh=config.refresh_profile,
                             rules=sorted((r, t, config.top_k, config.top_p) for r, t in rules),
                             progress=lambda line: print(line, flush=True))
    lengths = [len(first_chat(tokenizer, c, settings).input_ids) for c in conversations]
    fitting = Calibration(model, tokenizer, calibration, settings, profile, lengths)
    if budget:
        fit_auto_trees(fitting, entries, requested)
    price_gates(fitting, entries)
    price_schedules(fitting, entries)
    batch_sizes = sorted(set(config.batch_sizes))
    batch = (batch_profile(model, refresh=config.refresh_profile, progress=lambda line: print(line, flush=True))
             if max(batch_sizes) > 1 or config.plain_above == "auto" else None)
    predictions = predict_entries(fitting, entries, configs, earlier, [c.kind for c in conversations], batch)
    if config.plain_above == "auto":
        entries += auto_plain_entries(entries, predictions, configs[0], max(batch_sizes))
    print(f"draftheads eval: {len(conversations)} prompts from {config.prompts}, {len(entries)} drafters "
          f"({', '.join(e.name for e in entries)}), {len(configs)} rule/temperature settings, target "
          f"{target_info['name']} in {target_info['dtype']}", flush=True)
    found = measure(model, tokenizer, conversations, entries, configs, settings, progress, batch_sizes,
                    None if config.plain_above == "auto" else config.plain_above)
    rows = [row for size, at_size in found.items()
            for row in build_rows(at_size, entries, configs, conversations, size)]
    for row in rows:
        row.update(prediction_columns(predictions.get((row["drafter"], row["rule"], row["temperature"])), row))
    folder = report_folder(out, drafters)
    report = {
        "created": now(), "target": target_info, "environment": environment(),
        "settings": {
            "drafters": list(drafters), "prompts": config.prompts, "limit": config.limit, "preset": config.preset,
            "accept": list(config.accept),
            "temperatures": [float(t) for t in config.temperatures], "tree": config.tree,
            "max_new_tokens": config.max_new_tokens, "dtype": target_info["dtype"], "seed": config.seed,
            "seed_rule": SEED_RULE, "top_k": config.top_k, "top_p": config.top_p, "combined": config.combined_modes,
            "typical_epsilon": config.typical_epsilon, "typical_delta": config.typical_delta,
            "stop_ids": list(settings.decode.eos_token_id), "batch_sizes": batch_sizes,
            "plain_above": config.plain_above, "calibration_prompts": [c.prompt_id for c in calibration],
            "tau_from": str(earlier.path) if earlier else None,
        },
        "cost_profile": {"key": profile.key, "created": profile.created},
        **results_section(found, entries, conversations, skipped, rows),
    }
    report["plots"] = write_plots(folder, rows, report["by_kind"]) if rows else []
    write_report(folder, report)
    print_summary(rows, report, target_info["dtype"])
    print(f"draftheads eval: report in {folder}/report.md (tau includes the bonus token)", flush=True)
    return folder


def auto_plain_entries(entries, predictions: dict, cfg, largest: int) -> list:
    """`--plain-above auto`: each drafter again, decoding plainly above the live rows its prediction (under the first
    rule) says speculation pays for, measured beside it speculating always."""
    out = []
    for entry in entries:
        forecast = predictions.get((entry.name, cfg.rule, cfg.temperature))
        if forecast is not None:
            rows = forecast.plain_above(largest)
            out.append(plain_above_entry(entry, rows))
            print(f"draftheads eval: {entry.name}: predicted to pay up to {rows} live rows; measured as "
                  f"{entry.name}@auto beside it", flush=True)
    return out


def print_summary(rows: list[dict], report: dict, dtype: str) -> None:
    """The short table (report.md has every column), the batch curve, and a warning where fp32 greedy outputs
    parted from plain decoding."""
    print(format_table(rows, SHORT_COLUMNS))
    if report["batch_curve"]:
        print(format_batch_table(report["batch_curve"]))
    broken = [r["drafter"] for r in rows if r["greedy_mismatches"]]
    if broken and dtype == "fp32":
        print("draftheads eval: WARNING: in fp32 greedy speculative output must equal plain decoding, but "
              f"{', '.join(broken)} differed (see mismatched_prompts in report.json): the drafter integration or the "
              "loop is broken", flush=True)
