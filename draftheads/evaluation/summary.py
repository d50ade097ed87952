"""The figures of an evaluation's rows, from the merged `GenerationStats` of a drafter's speculative runs and of the
plain-decoding runs of the same prompts (interleaved with them, same process):

    tau        tokens emitted per verification forward, the bonus token INCLUDED (plain decoding: 1.0)
    alpha      i.i.d. acceptance estimate: accepted drafts / (accepted drafts + steps that stopped short of K)
    K          draft depth (levels of the tree); c = draft time per level / plain decode-step time
    chain      (1 - alpha^(K+1)) / ((1 - alpha) (K c + 1)), the chain formula (Leviathan et al. 2023, eq. 1),
               which takes a verify as one decode step
    speedup    spec tokens/s / plain tokens/s, both end to end (prefill included)
    predicted  the cost model's speedup (costmodel/cost_model.py), made before the run from the machine's
               profile and the drafter's acceptance on the calibration prompts; error = predicted / speedup - 1

At batch size B the rows of a batch share each step's wall time evenly, so tokens/s is the batch's
throughput, and tau, alpha and the acceptance rates are per row. `batch_curve` gathers one drafter's
rows over the batch sizes and names the smallest at which its speedup falls below 1.
"""

from __future__ import annotations

import collections

from draftheads.decoding.stats import GenerationStats

# ---------------------------------------------------------------- formulas


def chain_speedup(alpha: float, k: int, c: float) -> float:
    """Predicted speedup of a K-draft chain with i.i.d. acceptance alpha and draft cost c per draft token
    (in target decode steps): (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)). Verify cost is taken as one step."""
    return expected_tokens(alpha, k) / (k * c + 1)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per forward of a K-draft chain: 1 + alpha + ... + alpha^K."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def estimate_alpha(stats: GenerationStats, depth: int) -> float:
    """The i.i.d. per-draft acceptance rate that best explains the accepted lengths (maximum likelihood for a
    geometric cut at K = depth): accepted drafts / (accepted drafts + steps that stopped short of K).

    A step with nothing drafted (prompt lookup without a match) or whose accepted path ended at a leaf
    above depth K counts as a stop, as the chain formula's model of always drafting K tokens demands.
    """
    accepted = sum(stats.step_accepted)
    stops = sum(1 for n in stats.step_accepted if n < depth)
    return accepted / (accepted + stops) if accepted + stops else 0.0


def accepted_histogram(stats: GenerationStats) -> list[int]:
    """[n]: steps that accepted exactly n drafts (before EOS / length truncation)."""
    counts = collections.Counter(stats.step_accepted)
    return [counts.get(n, 0) for n in range(max(counts, default=0) + 1)]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarise(plain: GenerationStats, spec: GenerationStats, *, depth: int) -> dict:
    """The comparison numbers of one drafter/rule/temperature against plain decoding of the same prompts.

    depth: K, the draft levels requested per step (the tree's depth); c is per level.
    """
    step_s = plain.decode_s / max(1, plain.steps)          # one plain decoding forward (+ its sampling)
    draft_per_step = spec.mean_draft_s
    draft_cost = _ratio(draft_per_step, step_s)            # K c: drafting time of a step, in target steps
    c = draft_cost / depth if draft_cost is not None and depth else 0.0
    alpha = estimate_alpha(spec, depth)
    forwards_plain, forwards_spec = plain.steps + plain.prompts, spec.steps + spec.prompts  # prefills count
    return {
        "prompts": spec.prompts, "new_tokens": spec.new_tokens, "steps": spec.steps,
        "tau": spec.tau, "mean_accepted": spec.mean_accepted,
        "acceptance_rates": spec.acceptance_rates, "drafted": list(spec.drafted), "reached": list(spec.reached),
        "accepted": list(spec.accepted), "accepted_hist": accepted_histogram(spec),
        "alpha": alpha, "depth": depth, "mean_nodes": sum(spec.step_nodes) / max(1, spec.steps),
        "plain_step_s": step_s, "draft_s_per_step": draft_per_step, "verify_s_per_step": spec.mean_verify_s,
        "c": c, "draft_cost": draft_cost, "verify_cost": _ratio(spec.mean_verify_s, step_s),
        "forwards_plain": forwards_plain, "forwards_spec": forwards_spec,
        "forwards_saved": 1 - forwards_spec / forwards_plain if forwards_plain else None,
        "tokens_per_s_plain": plain.tokens_per_s, "tokens_per_s_spec": spec.tokens_per_s,
        "speedup": _ratio(spec.tokens_per_s, plain.tokens_per_s),
        "chain_tau": expected_tokens(alpha, depth), "tau_by_context": spec.tau_by_context(),
        "chain_speedup": chain_speedup(alpha, depth, c),
    }


def batch_curve(rows: list[dict]) -> list[dict]:
    """One entry per drafter x rule x temperature: its numbers at every batch size (the predicted speedup too, None
    where none was made) and `stops_paying_at`,
    the smallest batch size measured whose speedup is below 1 (None: it paid at every size measured)."""
    curves: dict[tuple, dict] = {}
    for row in sorted(rows, key=lambda r: r["batch_size"]):
        key = (row["drafter"], row["rule"], row["temperature"])
        curve = curves.setdefault(key, {"drafter": row["drafter"], "rule": row["rule"],
                                        "temperature": row["temperature"],
                                        "tree": row["tree"], "batch_sizes": [], "speedup": [], "tau": [],
                                        "tokens_per_s_plain": [], "tokens_per_s_spec": [], "predicted": [],
                                        "stops_paying_at": None})
        curve["batch_sizes"].append(row["batch_size"])
        curve["predicted"].append(row.get("predicted_speedup"))
        for name in ("speedup", "tau", "tokens_per_s_plain", "tokens_per_s_spec"):
            curve[name].append(row[name])
        if curve["stops_paying_at"] is None and row["speedup"] is not None and row["speedup"] < 1:
            curve["stops_paying_at"] = row["batch_size"]
    return list(curves.values())
