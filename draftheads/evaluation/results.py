"""The report's rows, from the measured runs: one per drafter x rule x temperature (and batch size) against the plain
runs of the same conversations, the same again per task kind and per prompt, and whether greedy outputs kept to plain
decoding."""

from __future__ import annotations

from draftheads.decoding.stats import GenerationStats, shared_prefix_length
from draftheads.evaluation.summary import batch_curve, summarise
from draftheads.measurement.entries import Entry, entry_info
from draftheads.measurement.measure import Measurements, RunConfig


def results_section(found: dict[int, Measurements], entries, conversations, skipped: dict, rows: list[dict]) -> dict:
    """plain: the plain runs' summary per temperature ('greedy', 'T=0.7'; prefixed 'B=4 ' beyond batch size 1)."""
    plain = {}
    for size, at_size in found.items():
        for key, runs in at_size.plain.items():
            name = "greedy" if key == 0 else f"T={key:g}"
            if list(found) != [1]:
                name = f"B={size} {name}"
            plain[name] = GenerationStats.merged(o.stats for o in runs).summary()
    return {"drafters": [entry_info(e) for e in entries], "prompt_count": len(conversations),
            "prompts_skipped": sum(skipped.values()), "skipped_reasons": skipped, "plain": plain, "results": rows,
            "batch_curve": batch_curve(rows) if set(found) != {1} else [],
            "by_kind": kind_rows(found[min(found)], entries, conversations),
            "by_prompt": prompt_rows(found[min(found)], conversations)}


def build_rows(found: Measurements, entries: list[Entry], configs: list[RunConfig], conversations,
               batch_size: int = 1) -> list[dict]:
    """One summary row per drafter x config, against the plain runs of the same conversations (at one batch size)."""
    rows = []
    for cfg in configs:
        plain = found.plain[cfg.plain_key]
        for entry in entries:
            spec = found.spec[(entry.name, cfg)]
            row = {"drafter": entry.name, "kind": entry.kind, "rule": cfg.rule, "temperature": cfg.temperature,
                   "tree": entry.info["tree"], "batch_size": batch_size}
            row.update(summarise(GenerationStats.merged(o.stats for o in plain),
                                 GenerationStats.merged(o.stats for o in spec), depth=entry.depth))
            row.update(compare_outputs(plain, spec, cfg, conversations))
            rows.append(row)
    return rows


def kind_rows(found: Measurements, entries: list[Entry], conversations) -> list[dict]:
    """The table's rows again for each task kind of the prompts (none when they have no kinds), from the same runs."""
    kinds = sorted({c.kind for c in conversations if c.kind})
    configs = list(dict.fromkeys(cfg for _, cfg in found.spec))
    rows = []
    for kind in kinds:
        keep = [i for i, c in enumerate(conversations) if c.kind == kind]
        part = Measurements({key: [runs[i] for i in keep] for key, runs in found.plain.items()},
                            {key: [runs[i] for i in keep] for key, runs in found.spec.items()})
        for row in build_rows(part, entries, configs, [conversations[i] for i in keep]):
            rows.append({"task_kind": kind, "task_prompts": len(keep), **row})
    return rows


def prompt_rows(found: Measurements, conversations) -> list[dict]:
    """One row per prompt x drafter x config from the same runs: where a total comes from (a few prompts whose
    target output loops or echoes the prompt can carry prompt lookup's tau for a whole kind)."""
    rows = []
    for (name, cfg), outputs in found.spec.items():
        plain = found.plain[cfg.plain_key]
        for conv, out, base in zip(conversations, outputs, plain):
            rows.append({"prompt_id": conv.prompt_id, "task_kind": conv.kind, "prompt": conv.users[0][:60],
                         "drafter": name, "rule": cfg.rule, "temperature": cfg.temperature,
                         "new_tokens": out.stats.new_tokens, "steps": out.stats.steps, "tau": out.stats.tau,
                         "plain_tokens": len(base.tokens),
                         "same_as_plain": None if cfg.sampled else out.tokens == base.tokens})
    return rows


def compare_outputs(plain: list, spec: list, cfg: RunConfig, conversations) -> dict:
    """Greedy: which prompts' outputs differ from plain decoding. Sampled: mean target log-prob per token."""
    out = {"greedy_mismatches": None, "mismatched_prompts": [], "first_divergence": [], "logprob_spec": None,
           "logprob_plain": None}
    if not cfg.sampled:
        bad = [(c.prompt_id, a.tokens, b.tokens) for c, a, b in zip(conversations, plain, spec) if a.tokens != b.tokens]
        # where the outputs part: late divergences after near-ties are bf16 rounding, early ones a broken loop
        first = [shared_prefix_length(a, b) for _, a, b in bad]
        out.update(greedy_mismatches=len(bad), mismatched_prompts=[i for i, _, _ in bad], first_divergence=first)
    else:
        out["logprob_spec"] = mean_logprob(spec)
        out["logprob_plain"] = mean_logprob(plain)
    return out


def mean_logprob(outputs) -> float | None:
    count = sum(o.logprob_count for o in outputs)
    return sum(o.logprob_sum for o in outputs) / count if count else None
