"""The numbers of an in-engine evaluation (evaluation/engine_eval.py) and the files they go into.

One row per llama-server configuration, summed over the conversations:

    tok/s            generated tokens / engine time (prompt processing included), per the engine's own timings
    speedup          tok/s / llama.cpp plain's tok/s, measured side by side
    drafted/accepted the engine's counts of drafted and accepted tokens; acceptance = accepted / drafted
    tokens/pass      tokens per target forward after the prompt's (accepted drafts + the target's own token), the
                     engine's tau: (tokens - turns) / (tokens - turns - accepted)
    our tau          our own loop's tau for the same drafter drafting a chain of the same length on the same prompts
"""

from __future__ import annotations

import json
from pathlib import Path

from draftheads.decoding.stats import shared_prefix_length
from draftheads.evaluation.plots import _pyplot, save
from draftheads.evaluation.report import _f


def engine_rows(configs, sides: dict, ours: dict) -> list[dict]:
    plain = summary(sides[configs[0].name])
    rows = []
    for config in configs:
        row = {"config": config.name, "kind": config.kind, "drafter": config.drafter,
               "draft_tokens": config.draft_tokens, "p_min": config.p_min,
               **summary(sides[config.name])}
        row["speedup"] = row["tokens_per_s"] / plain["tokens_per_s"] if plain["tokens_per_s"] else None
        row.update(compare(sides[configs[0].name], sides[config.name]))
        # our loop drafts the whole chain: compared with the engine's own full-length drafts (p_min 0)
        mine = (ours.get((config.drafter, config.draft_tokens)) if config.kind == "drafter" and not config.p_min
                else None)
        row["our_tau"] = mine["tau"] if mine else None
        row["our_acceptance_rates"] = mine["acceptance_rates"] if mine else None
        row["tau_gap"] = row["tokens_per_pass"] / mine["tau"] - 1 if mine and mine["tau"] else None
        rows.append(row)
    return rows


def summary(sides: list) -> dict:
    replies = [reply for side in sides for reply in side.replies]
    tokens = sum(r.new_tokens for r in replies)
    seconds = sum(r.total_s for r in replies)
    drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
    after_prompt = sum(max(0, r.new_tokens - 1) for r in replies)
    passes = sum(r.target_passes for r in replies)
    return {"prompts": len(sides), "turns": len(replies), "new_tokens": tokens, "engine_s": seconds,
            "decode_s": sum(r.decode_s for r in replies), "prompt_s": sum(r.prompt_s for r in replies),
            "tokens_per_s": tokens / seconds if seconds else 0.0, "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None, "target_passes": passes,
            "tokens_per_pass": after_prompt / passes if passes else None}


def compare(plain: list, spec: list) -> dict:
    """Conversations whose greedy output differs from llama.cpp's plain greedy output, and where they part."""
    bad = [(i, a.tokens, b.tokens) for i, (a, b) in enumerate(zip(plain, spec)) if a.tokens != b.tokens]
    first = [shared_prefix_length(a, b) for _, a, b in bad]
    return {"greedy_mismatches": len(bad), "mismatched_prompts": [i for i, _, _ in bad], "first_divergence": first}


COLUMNS = ("configuration", "n", "tok/s", "speedup", "drafted", "accepted", "acceptance", "tokens/pass", "our tau",
           "gap", "greedy mismatch")


def format_engine_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        gap = None if r["tau_gap"] is None else 100 * r["tau_gap"]
        lines.append("| " + " | ".join([
            r["config"], str(r["draft_tokens"] or "-"), _f(r["tokens_per_s"], ".1f"), _f(r["speedup"], ".2f", "x"),
            str(r["drafted"]), str(r["accepted"]),
            _f(None if r["acceptance"] is None else 100 * r["acceptance"], ".0f", "%"), _f(r["tokens_per_pass"]),
            _f(r["our_tau"]), _f(gap, "+.0f", "%"), f"{r['greedy_mismatches']}/{r['prompts']}",
        ]) + " |")
    return "\n".join(lines)


def format_engine_markdown(report: dict) -> str:
    s, target, engine = report["settings"], report["target"], report["engine"]
    hw = report["environment"]["hardware"]
    rows = report["results"]
    best = max((r for r in rows if r["kind"] != "plain"), key=lambda r: r["speedup"] or 0, default=None)
    out = [
        "# draftheads engine eval llama.cpp", "",
        f"{report['created']} · llama.cpp from {engine['sdist']} ({engine['server']}) · target "
        f"`{Path(target['gguf']).name}` · {hw['cpu']} ({hw['cpu_count']} cores)", "",
        f"Prompts: {s['prompts']} ({report['prompt_count']} conversations, {report['prompts_skipped']} skipped) · "
        f"max_new_tokens {s['max_new_tokens']} · greedy · one llama-server per configuration, all decoding every "
        "conversation back to back (order reversed each conversation)", "",
        format_engine_table(rows), "",
        f"Fastest: **{best['config']}**, {best['speedup']:.2f}x over llama.cpp plain decoding."
        if best and best["speedup"] else "",
        "",
        "- tok/s: generated tokens per second of the engine's own time, prompt processing included; speedup = tok/s / "
        "llama.cpp plain's.",
        "- drafted, accepted: the engine's counts (draft_n, draft_n_accepted); acceptance = accepted / drafted.",
        "- tokens/pass: tokens per target forward after the prompt's, the accepted drafts and the target's own token "
        "(the engine's tau); our tau: our loop's for the same drafter drafting a chain of the same length on the same "
        f"prompts (target in {s.get('ours_dtype')}), gap = tokens/pass / our tau - 1.",
        "- greedy mismatch: conversations whose output differs from llama.cpp's plain greedy output.",
        "- n-gram modes at llama.cpp's settings (12-token key, 48 drafted) and at 'key 3 draft 6'; a drafter '+ "
        "ngram-simple' drafts with both (llama.cpp keeps the n-gram draft when it has one).",
    ]
    if report.get("plots"):
        out += ["", "## Plots", ""] + [f"![{name}]({name})" for name in report["plots"]]
    out += ["", "## Setup", "", "```json", json.dumps({"settings": s, "engine": engine}, indent=1, default=str),
            "```", ""]
    return "\n".join(out)


def write_engine_plots(folder: Path, rows: list[dict]) -> list[str]:
    """engine_speedup.png (every configuration) and engine_tau.png (tokens per pass vs our tau by draft length)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.5))
    ax.barh([r["config"] for r in rows][::-1], [r["speedup"] or 0 for r in rows][::-1], color="tab:blue")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set(xlabel="speedup over llama.cpp plain decoding", title="llama.cpp, in-engine")
    save(plt, fig, folder / "engine_speedup.png")
    names = ["engine_speedup.png"]
    drafters = sorted({r["drafter"] for r in rows if r["kind"] == "drafter"})
    if drafters:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for name in drafters:
            mine = sorted((r for r in rows if r["kind"] == "drafter" and r["drafter"] == name and not r["p_min"]),
                          key=lambda r: r["draft_tokens"])
            ns = [r["draft_tokens"] for r in mine]
            ax.plot(ns, [r["tokens_per_pass"] or 0 for r in mine], marker="o", label=f"{name}: llama.cpp tokens/pass")
            if any(r["our_tau"] for r in mine):
                ax.plot(ns, [r["our_tau"] or 0 for r in mine], marker="s", ls="--", label=f"{name}: our loop's tau")
        ax.set(xlabel="draft length (chain)", ylabel="tokens per target forward", title="Engine vs our loop")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(plt, fig, folder / "engine_tau.png")
        names.append("engine_tau.png")
    return names
