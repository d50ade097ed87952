"""The files an evaluation's numbers go into: report.json, report.md, the printed tables (the numbers themselves:
evaluation/summary.py), and what they record of the run (of the machine: data/hardware.environment)."""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

from draftheads.decoding.settings import applied_rule
from draftheads.evaluation.presets import PRESETS

TAU_NOTE = ("tau = mean tokens emitted per target verification forward, INCLUDING the bonus token the target "
            "produces itself (plain decoding has tau = 1; accepted drafts per forward = tau - 1)")


# ---------------------------------------------------------------- files


def prediction_sources(report: dict) -> list[str]:
    """A note naming where the predictions' acceptance came from, when an earlier evaluation supplied some."""
    earlier = [r["drafter"] + " " + r["rule"] for r in report["results"]
               if r.get("predicted_from") == "earlier evaluation"]
    if not earlier:
        return []
    return [f"- predicted from an earlier evaluation's tau and nodes per step ({report['settings'].get('tau_from')}, "
            f"not its timings): {', '.join(earlier)}; every other row from the calibration prompts."]


def write_report(folder: Path, report: dict, markdown: str | None = None) -> Path:
    """report.json (everything) and report.md (the tables, or `markdown`) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1, default=_jsonable) + "\n")
    tmp.replace(folder / "report.json")
    (folder / "report.md").write_text(markdown if markdown is not None else format_markdown(report))
    return folder


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _mismatch(row: dict) -> str:
    if row.get("greedy_mismatches") is None:
        return "n/a"
    return f"{row['greedy_mismatches']}/{row['prompts']}"


TABLE_COLUMNS = ("drafter", "rule", "T", "tree", "B", "tau", "alpha", "accept/depth", "c", "verify", "fwd saved",
                 "tok/s plain", "tok/s spec", "speedup", "predicted", "range", "error", "error at tau", "chain",
                 "greedy mismatch")


def table_row(row: dict) -> list[str]:
    rates = "/".join(f"{a:.2f}" for a in row["acceptance_rates"][:6]) or "-"
    return [row["drafter"], row["rule"], f"{row['temperature']:g}", row["tree"], str(row.get("batch_size", 1)),
            _f(row["tau"]), _f(row["alpha"]),
            rates, _f(row["c"], ".3f"), _f(row["verify_cost"], ".2f", "x"), _f(_pct(row["forwards_saved"]), ".0f", "%"),
            _f(row["tokens_per_s_plain"], ".1f"), _f(row["tokens_per_s_spec"], ".1f"), _f(row["speedup"], ".2f", "x"),
            _f(row.get("predicted_speedup"), ".2f", "x"), _range(row),
            _f(_pct(row.get("prediction_error")), "+.0f", "%"),
            _f(_pct(row.get("cost_model_error")), "+.0f", "%"),
            _f(row["chain_speedup"], ".2f", "x"), _mismatch(row)]


def _range(row: dict) -> str:
    """The predicted range, starred when the measured speedup fell outside it."""
    if not row.get("predicted_range"):
        return "-"
    low, high = row["predicted_range"]
    return f"{low:.2f}-{high:.2f}x" + ("" if row.get("in_predicted_range") in (True, None) else " *")


def _pct(x):
    return None if x is None else 100 * x


# What a run prints: the columns a newcomer reads first. report.md has them all.
SHORT_COLUMNS = ("drafter", "rule", "T", "tree", "B", "tau", "accept/depth", "tok/s plain", "tok/s spec", "speedup",
                 "predicted", "greedy mismatch")


def format_table(rows: list[dict], columns: tuple[str, ...] = TABLE_COLUMNS) -> str:
    """The comparison table (Markdown) of `columns`, one line per drafter x rule x temperature (x batch size; the B
    column only when some row is above batch size 1)."""
    shown = [i for i, name in enumerate(TABLE_COLUMNS) if name in columns
             and (name != "B" or any(r.get("batch_size", 1) != 1 for r in rows))]
    lines = ["| " + " | ".join(TABLE_COLUMNS[i] for i in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(table_row(r)[i] for i in shown) + " |" for r in rows]
    return "\n".join(lines)


def format_batch_table(curves: list[dict]) -> str:
    """Speedup (and tau) per batch size, one line per drafter x rule x temperature, and where it stops paying."""
    sizes = sorted({b for c in curves for b in c["batch_sizes"]})
    head = ["drafter", "rule", "T", "tree"] + [f"B={b}" for b in sizes] + ["stops paying at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    plain_greedy = {}  # every greedy row of a batch size is compared with the same plain runs
    for c in curves:
        if applied_rule(c["rule"], c["temperature"]) == "greedy":
            plain_greedy.update(zip(c["batch_sizes"], c["tokens_per_s_plain"]))
    for c in curves:
        at = dict(zip(c["batch_sizes"], zip(c["speedup"], c["tau"], c.get("predicted") or [None] * len(c["tau"]))))
        cells = [f"{_f(at[b][0], '.2f', 'x')} (tau {_f(at[b][1])}"
                 + (f", predicted {at[b][2]:.2f}x)" if at[b][2] is not None else ")") if b in at else "-"
                 for b in sizes]
        stops = f"B={c['stops_paying_at']}" if c["stops_paying_at"] else f"pays up to B={max(c['batch_sizes'])}"
        lines.append("| " + " | ".join([c["drafter"], c["rule"], f"{c['temperature']:g}", c["tree"], *cells, stops])
                     + " |")
    if plain_greedy:
        lines.append("| plain greedy tok/s | | | | " + " | ".join(_f(plain_greedy.get(b), ".1f") for b in sizes)
                     + " | |")
    return "\n".join(lines)


def format_kind_table(rows: list[dict]) -> str:
    """One line per task kind x drafter x rule x temperature, prompt lookup's tau of the same kind and rule beside."""
    lookup = {(r["task_kind"], r["rule"], r["temperature"]): r["tau"] for r in rows if r["kind"] == "lookup"}
    lines = ["| task kind | prompts | drafter | rule | T | tau | accept/depth | speedup | lookup tau |",
             "|" + "---|" * 9]
    for r in rows:
        rates = "/".join(f"{a:.2f}" for a in r["acceptance_rates"]) or "-"
        lines.append(f"| {r['task_kind']} | {r['task_prompts']} | {r['drafter']} | {r['rule']} | {r['temperature']:g} "
                     f"| {_f(r['tau'])} | {rates} | {_f(r['speedup'], '.2f', 'x')} | "
                     f"{_f(lookup.get((r['task_kind'], r['rule'], r['temperature'])))} |")
    return "\n".join(lines)


def format_prompt_table(rows: list[dict]) -> str | None:
    """One line per prompt, the tau of every drafter (and rule/temperature, where there are several) in columns;
    * marks a greedy output that parted from plain decoding (it continues another text from there)."""
    if not rows:
        return None
    configs = list(dict.fromkeys((r["drafter"], r["rule"], r["temperature"]) for r in rows))
    several = len({(rule, t) for _, rule, t in configs}) > 1
    labels = [f"{d} {rule} T={t:g}" if several else d for d, rule, t in configs]
    prompts: dict[int, dict] = {}
    for r in rows:
        line = prompts.setdefault(r["prompt_id"], {"row": r, "cells": {}})
        line["cells"][(r["drafter"], r["rule"], r["temperature"])] = (f"{r['tau']:.2f}"
                                                                      + ("*" if r["same_as_plain"] is False else ""))
    lines = ["| prompt | task kind | tokens | " + " | ".join(labels) + " |", "|" + "---|" * (3 + len(labels))]
    for pid, line in prompts.items():
        r = line["row"]
        text = " ".join(r["prompt"].split()).replace("|", "\\|")
        cells = [line["cells"].get(c, "") for c in configs]
        lines.append(f"| {pid}: {text} | {r['task_kind'] or '-'} | {r['plain_tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_context_table(rows: list[dict]) -> str | None:
    """tau of the steps taken at each range of context length, one line per row that reached past 512 tokens
    (None when none did): whether acceptance falls off on long prompts."""
    long = [r for r in rows if r.get("kind") != "plain" and any(not b["context"].startswith(("0-", "256-"))
                                                                for b in r.get("tau_by_context", []))]
    if not long:
        return None
    ranges = list(dict.fromkeys(b["context"] for r in long for b in r["tau_by_context"]))
    lines = ["| " + " | ".join(["task kind", "drafter", "rule", "T", *[f"{c} tokens" for c in ranges]]) + " |",
             "|" + "---|" * (4 + len(ranges))]
    for r in long:
        at = {b["context"]: b for b in r["tau_by_context"]}
        cells = [f"{at[c]['tau']:.2f} ({at[c]['steps']})" if c in at else "-" for c in ranges]
        lines.append("| " + " | ".join([r.get("task_kind", "all"), r["drafter"], r["rule"], f"{r['temperature']:g}",
                                        *cells]) + " |")
    return "\n".join(lines)


def format_quality(rows: list[dict]) -> str | None:
    """Mean target log-probability per generated token, spec outputs vs plain sampling (sampled rules only)."""
    rated = [r for r in rows if r.get("logprob_spec") is not None]
    if not rated:
        return None
    lines = ["| drafter | rule | T | logprob/token spec | logprob/token plain | difference |",
             "|---|---|---|---|---|---|"]
    for r in rated:
        diff = r["logprob_spec"] - r["logprob_plain"] if r.get("logprob_plain") is not None else None
        lines.append(f"| {r['drafter']} | {r['rule']} | {r['temperature']:g} | {r['logprob_spec']:.3f} | "
                     f"{_f(r.get('logprob_plain'), '.3f')} | {_f(diff, '+.3f')} |")
    return "\n".join(lines)


def format_markdown(report: dict) -> str:
    s, target, env = report["settings"], report["target"], report["environment"]
    hw = env["hardware"]
    device = (hw["cuda"]["device"] if hw.get("cuda")
              else f"{hw['cpu']} ({hw['cpu_count']} cores, {hw['torch_threads']} threads)")
    out = [
        "# draftheads eval", "",
        f"{report['created']} · target `{target['name']}` ({target.get('architecture')}, {target['dtype']}) "
        f"· {device}", "",
        f"Prompts: {s['prompts']} ({report['prompt_count']} conversations, {report['prompts_skipped']} skipped) · "
        + (f"preset {s['preset']} ({PRESETS[s['preset']].what}) · " if s.get("preset") in PRESETS else "")
        + f"max_new_tokens {s['max_new_tokens']} · seed {s['seed']} · plain and speculative decoding interleaved "
        "prompt by prompt in one process", "",
        format_table(report["results"]), "",
        f"- {TAU_NOTE}.",
        "- alpha: i.i.d. per-draft acceptance estimate, accepted drafts / (accepted drafts + steps that stopped short "
        "of depth K; a step with nothing drafted counts as a stop); accept/depth: P(depth d accepted | depth d-1 "
        "reached with a draft to check).",
        "- c: drafting time per step / (K x one plain decode step), K = the tree's depth; verify: verification step "
        "time / plain step time.",
        "- fwd saved: 1 - target forwards (prefills included) with drafting / without.",
        "- tok/s: generated tokens per second end to end (prefill included); speedup = spec / plain, measured.",
        "- predicted: the speedup the cost model predicted before the run, from this machine's cost profile (a verify "
        "forward's time by node count and context, the rule's cost) and the drafter's tau, nodes and draft time on the "
        "calibration prompts (not evaluated); error = predicted / measured - 1 (batch size 1 only); error at tau: the "
        "same cost model given the tau and nodes per step this run measured (not its timings), the error of the costs "
        "alone. range: the 95% range of the prediction, from the spread of the calibration prompts' own predicted "
        "speedups and the cost model's error on their steps (costmodel/forecast.py); * where the measured speedup "
        "fell outside it. chain = "
        "(1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)), the chain formula, which assumes every step drafts K tokens and "
        "a verify costs one decode step.",
        *prediction_sources(report),
        "- greedy mismatch: prompts whose output differs from plain decoding (greedy rule or T = 0; n/a when sampled). "
        "In fp32 there must be none; in bf16/fp16 a multi-token verification rounds differently from a one-token step, "
        "so near-ties can flip and outputs diverge from there on.",
    ]
    if report.get("batch_curve"):
        out += ["", "## Speedup vs batch size", "",
                "Each batch size decodes the same prompts in batches of that many rows (left-padded, each row with its "
                "own drafter state, seed and acceptance; finished rows leave the batch), interleaved with plain "
                "decoding of the same batches. Cells: speedup = spec tok/s / plain tok/s at that batch size (tau per "
                "row and the speedup predicted before the run in brackets). 'stops paying at': the smallest batch size "
                "measured whose speedup is below 1; "
                "`--plain-above N` (eval.plain_above) decodes plainly while more than N rows are generating; "
                "`--plain-above auto` measures each drafter again as '<name>@auto', decoding plainly above the rows "
                "the cost model predicts speculation pays for (costmodel/batch_profile.py).", "",
                format_batch_table(report["batch_curve"])]
    if report.get("by_kind"):
        out += ["", "## By task kind", "",
                "The same runs, each kind's prompts on their own: tau, acceptance per depth and speedup of every "
                "drafter, with prompt lookup's tau on the same prompts beside it.", "",
                format_kind_table(report["by_kind"])]
    by_context = format_context_table(report["results"] + report.get("by_kind", []))
    if by_context:
        out += ["", "## Acceptance by context length", "",
                "tau of the steps taken with this many tokens already in the context (prompt and reply so far); the "
                "number of steps in brackets. A drafter trained on short rows loses acceptance here first.", "",
                by_context]
    by_prompt = format_prompt_table(report.get("by_prompt", []))
    if by_prompt:
        out += ["", "## By prompt", "",
                "tau of every drafter on each prompt (tokens: what plain decoding wrote; * the output parted from "
                "plain decoding). A prompt whose output loops or repeats the prompt gives prompt lookup a tau of 4-6 "
                "and can carry a whole kind's total.", "", by_prompt]
    quality = format_quality(report["results"])
    if quality:
        out += ["", "## Quality of sampled outputs", "",
                "Mean log-probability per generated token under the target (temperature 1, no top-k/top-p) of the "
                "speculative outputs and of plain sampling at the same temperature, same prompts. Strict acceptance is "
                "lossless (differences are sampling noise); typical acceptance is not.", "", quality]
    if report.get("plots"):
        out += ["", "## Plots", ""] + [f"![{name}]({name})" for name in report["plots"]]
    out += ["", "## Setup", "", "```json", json.dumps({"settings": s, "versions": env["versions"]}, indent=1),
            "```", ""]
    return "\n".join(out)
