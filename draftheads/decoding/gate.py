"""Whether the learned half of a learned + lookup combination pays for itself, decided step by step.

A step costs T without the learned tree (verifying the lookup chain alone; a plain decode step when lookup
finds nothing) and T + D with it (its draft pass and the larger verification). It commits A tokens without
it (the lookup chain's accepted prefix and the target's next token) and A + g with it (g: what the learned
branches add). Drafting the learned tree raises tokens per second iff (A + g) / (T + D) > A / T, that is

    g / A > D / T

The gate keeps running means of A and g for the two situations a step is in before anything is drafted (lookup
found a chain or not: both the cost ratio and what the learned tree adds differ a lot between them), and drafts
the learned tree in a situation while its g / A beats that situation's D / T. The means are plain averages over
the first 1 / decay steps (an exponential one from the first step would let one unlucky first draft keep the
learned tree off for most of a reply), and a situation drafts its first `min_samples` steps whatever they show.
While the learned tree does not pay, it is still drafted every `probe_every`-th step of the situation, so a
drafter that starts paying again (the text changed kind) is noticed. Each decision depends only on how earlier
drafts were accepted, that is on the committed text, so every acceptance rule stays exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from draftheads.core.errors import DraftheadsError


@dataclass(frozen=True)
class GateCosts:
    """D / T of each situation: what drafting the learned tree adds to a step, over the step without it."""

    without_chain: float
    with_chain: float

    def __post_init__(self):
        if min(self.without_chain, self.with_chain) < 0:
            raise DraftheadsError(f"gate costs are ratios of step times and cannot be negative, got {self}")

    def of(self, has_chain: bool) -> float:
        return self.with_chain if has_chain else self.without_chain


def gate_costs(target, drafter, nodes: int, depth: int, lookup_depth: int, context: float) -> GateCosts:
    """The costs at `context` cached tokens from this machine's profiles (costmodel/profile.py): target
    forwards in seconds, the drafter's pass in plain decode steps (timed beside one, so ratios survive drift).
    `nodes`: the learned tree's, root included; the grafted chain shares the root."""
    step = target.decode_step(context)
    draft = drafter.step_in_decode_steps(depth, nodes) * step
    chain = target.forward(lookup_depth + 1, context)
    return GateCosts(without_chain=(draft + target.forward(nodes, context) - step) / step,
                     with_chain=(draft + target.forward(nodes + lookup_depth, context) - chain) / chain)


def measured_costs(lookup, combined, learned_nodes: int, fallback: Callable[[], GateCosts]) -> GateCosts:
    """The costs from steps timed on this machine (GenerationStats of prompt lookup alone and of the grafted
    combination, run on the same prompts): each situation's median step (draft and verification) with and
    without the learned tree. On a CPU a forward's first extra token can cost far more than the ones after it,
    which the profile's per-token line smooths away. A situation without timed steps takes `fallback()`'s
    (called only then: an estimate may need timing of its own).
    A combined step with more nodes than the learned tree had a lookup chain grafted on; one with as many may
    have had a chain that the learned tree held already, which counts it as chainless (slightly cheaper)."""
    def median(stats, keep) -> float | None:
        times = sorted(d + v for n, d, v in zip(stats.step_nodes, stats.step_draft_s, stats.step_verify_s) if keep(n))
        return times[len(times) // 2] if times else None

    plain, chain = median(lookup, lambda n: n == 1), median(lookup, lambda n: n > 1)
    bare, grafted = median(combined, lambda n: n <= learned_nodes), median(combined, lambda n: n > learned_nodes)
    without = max(0.0, bare / plain - 1) if plain and bare else None
    with_chain = max(0.0, grafted / chain - 1) if chain and grafted else None
    if without is None or with_chain is None:
        estimate = fallback()
        without = estimate.without_chain if without is None else without
        with_chain = estimate.with_chain if with_chain is None else with_chain
    return GateCosts(without_chain=without, with_chain=with_chain)


class LearnedGate:
    """Running means per situation of A (tokens the step would commit without the learned tree) and g (what the
    learned tree added, on the steps that drafted it); `decay` is the weight of the newest step once 1 / decay
    steps are in."""

    def __init__(self, costs: GateCosts, decay: float = 0.1, probe_every: int = 8, min_samples: int = 4):
        if not 0 < decay <= 1 or probe_every < 1 or min_samples < 1:
            raise DraftheadsError(f"the gate needs 0 < decay <= 1, probe_every >= 1 and min_samples >= 1, got {decay}, "
                                  f"{probe_every} and {min_samples}")
        self.costs, self.decay, self.probe_every, self.min_samples = costs, decay, probe_every, min_samples
        self.reset()

    def reset(self) -> None:
        self.without = {False: [0.0, 0], True: [0.0, 0]}   # situation -> [mean A, steps] over all its steps
        self.added = {False: [0.0, 0], True: [0.0, 0]}     # situation -> [mean g, steps] over those that drafted it
        self.idle = {False: 0, True: 0}                    # steps of the situation since it last drafted it
        self.drafted_steps = self.steps = 0

    def fresh(self) -> "LearnedGate":
        """The same gate with nothing seen (another row's)."""
        return LearnedGate(self.costs, self.decay, self.probe_every, self.min_samples)

    def draft_learned(self, has_chain: bool) -> bool:
        """Whether this step, in situation `has_chain`, drafts the learned tree."""
        (without, _), (added, seen) = self.without[has_chain], self.added[has_chain]
        if seen < self.min_samples or self.idle[has_chain] + 1 >= self.probe_every:
            return True
        return added > without * self.costs.of(has_chain)

    def record(self, has_chain: bool, drafted: bool, without: int, added: int) -> None:
        """One step's outcome: `without` tokens the step would have committed without the learned tree, `added`
        the ones it added (0 when it was not drafted)."""
        self._update(self.without[has_chain], without)
        if drafted:
            self._update(self.added[has_chain], added)
        self.idle[has_chain] = 0 if drafted else self.idle[has_chain] + 1
        self.steps += 1
        self.drafted_steps += drafted

    def _update(self, mean: list, value: int) -> None:
        mean[1] += 1
        mean[0] += max(self.decay, 1 / mean[1]) * (value - mean[0])
