"""The cost gate of a learned + lookup combination: its rule against hand computations, its costs from a
profile, that a combination with it drafts the learned tree only while it pays and still decodes exactly,
and that the learned drafter reading skipped positions in one pass drafts what reading them step by step does."""

from __future__ import annotations

import copy

import pytest
import torch

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.gate import GateCosts, LearnedGate, gate_costs, measured_costs
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.stats import GenerationStats
from tests.decoding.stubs import OracleDrafter, RandomDrafter
from tests.decoding.test_batch import PROMPTS, target


def test_gate_drafts_while_added_tokens_beat_the_cost_ratio_and_probes_when_off():
    gate = LearnedGate(GateCosts(without_chain=0.5, with_chain=0.2), decay=0.5, probe_every=4, min_samples=1)
    assert gate.draft_learned(False) and gate.draft_learned(True)          # nothing seen: draft
    gate.record(False, True, without=1, added=1)                           # g / A = 1 > 0.5
    assert gate.draft_learned(False)
    gate.record(False, True, without=1, added=0)                           # means: A 1, g 0.5: 0.5 is not > 0.5
    assert not gate.draft_learned(False)
    decisions = []
    for _ in range(8):                                                    # off: drafted every 4th step only
        drafted = gate.draft_learned(False)
        decisions.append(drafted)
        gate.record(False, drafted, without=1, added=0)
    assert decisions == [False, False, False, True] * 2
    gate.record(True, True, without=4, added=1)                            # the other situation keeps its own means
    assert gate.draft_learned(True)                                        # 1 / 4 > 0.2
    gate.record(True, False, without=6, added=0)                           # A 5, g 1: 0.2 is not > 0.2
    assert not gate.draft_learned(True) and gate.steps == 12 and gate.drafted_steps == 5


def test_gate_drafts_its_first_steps_and_averages_them_plainly():
    """One unlucky first draft must not keep the learned tree off: the first min_samples steps draft, and the
    first 1 / decay steps weigh alike."""
    gate = LearnedGate(GateCosts(0.5, 0.5), decay=0.25, min_samples=3)
    for added in (0, 0):
        gate.record(False, gate.draft_learned(False), without=1, added=added)
    assert gate.draft_learned(False)                                       # 2 of 3 samples: still drafting
    gate.record(False, True, without=1, added=3)
    assert gate.added[False] == [1.0, 3] and gate.draft_learned(False)     # (0 + 0 + 3) / 3 = 1 > 0.5
    gate.record(False, True, without=1, added=0)
    gate.record(False, True, without=1, added=0)                           # then weight 1/4, 1/4: 0.75, 0.5625
    assert gate.added[False][0] == pytest.approx(0.5625)


def test_gate_settings_are_checked():
    with pytest.raises(DraftheadsError, match="cannot be negative"):
        GateCosts(-0.1, 0.2)
    with pytest.raises(DraftheadsError, match="probe_every"):
        LearnedGate(GateCosts(0.1, 0.1), probe_every=0)
    with pytest.raises(DraftheadsError, match="give switch or gate"):
        CombinedDrafter(RandomDrafter(50), switch=True, gate=LearnedGate(GateCosts(0.1, 0.1)))


class FlatTarget:
    """A profile where a forward of n tokens costs 1 + 0.1 (n - 1) seconds at any context."""

    def forward(self, queries, context):
        return 1 + 0.1 * (queries - 1)

    def decode_step(self, context):
        return self.forward(1, context)


class FlatDrafter:
    def step_in_decode_steps(self, depth, nodes):
        return 0.05 * depth + 0.01 * nodes


def test_gate_costs_from_the_profiles():
    costs = gate_costs(FlatTarget(), FlatDrafter(), nodes=5, depth=2, lookup_depth=6, context=300)
    draft = 0.05 * 2 + 0.01 * 5
    assert costs.without_chain == pytest.approx((draft + 1.4 - 1) / 1)                  # 5-node verify vs 1 token
    assert costs.with_chain == pytest.approx((draft + (1 + 0.1 * 10) - 1.6) / 1.6)      # 11 tokens vs the 7-token chain


def timed_steps(steps: list[tuple[int, float, float]]) -> GenerationStats:
    stats = GenerationStats()
    stats.step_nodes, stats.step_draft_s, stats.step_verify_s = (list(column) for column in zip(*steps))
    return stats


def test_gate_costs_from_timed_steps_are_median_steps_with_over_without_the_learned_tree():
    lookup = timed_steps([(1, 0.0, 1.0), (1, 0.0, 1.2), (1, 0.0, 9.0), (7, 0.0, 1.5), (5, 0.0, 1.5)])
    combined = timed_steps([(4, 0.2, 1.3), (4, 0.3, 1.5), (4, 0.2, 1.6), (9, 0.2, 1.9), (10, 0.3, 2.1)])
    costs = measured_costs(lookup, combined, learned_nodes=4,
                           fallback=lambda: pytest.fail("both situations were timed: no estimate needed"))
    assert costs.without_chain == pytest.approx(1.8 / 1.2 - 1)            # medians: 1.8 over 1.2 (9.0: an outlier)
    assert costs.with_chain == pytest.approx(2.4 / 1.5 - 1)               # the upper median of 2.1 and 2.4
    unseen = measured_costs(timed_steps([(1, 0.0, 1.0)]), combined, 4, fallback=lambda: GateCosts(5.0, 0.7))
    assert unseen.with_chain == 0.7 and unseen.without_chain == pytest.approx(0.8)   # lookup never found a chain


def run_counted(model, drafter, prompt, max_new):
    """Generate, counting how often the learned drafter is asked to draft."""
    calls = []
    propose = drafter.learned.propose
    drafter.learned.propose = lambda *a, **k: calls.append(1) or propose(*a, **k)
    out = speculative_generate(model, drafter, prompt, max_new, tree="chain:3", eos_token_id=[])
    return out, len(calls)


def test_gate_stops_drafting_a_useless_drafter_and_keeps_a_good_one_with_exact_output():
    model = target("qwen2")
    plain = speculative_generate(model, None, PROMPTS[2], 60, eos_token_id=[])
    costs = GateCosts(0.3, 0.3)
    useless = CombinedDrafter(RandomDrafter(model.config.vocab_size, tree=Tree.chain(3)), gate=LearnedGate(costs))
    out, asked = run_counted(model, useless, PROMPTS[2], 60)
    assert out.rows == plain.rows and asked < out.stats.steps / 2          # random drafts add nothing: mostly off
    assert out.stats.steps - 1 <= useless.gate.steps <= out.stats.steps   # the last step may end without being read
    good = CombinedDrafter(OracleDrafter(model, PROMPTS[2][0].item(), tree=Tree.chain(3)), gate=LearnedGate(costs))
    out, asked = run_counted(model, good, PROMPTS[2], 60)
    assert out.rows == plain.rows and asked == out.stats.steps             # the target's own drafts always pay


def test_learned_drafter_reading_skipped_positions_at_once_drafts_the_same():
    """While the gate keeps it off, the learned drafter is not run; when it drafts again it reads every position
    committed since in one pass, and drafts what it would have after reading them step by step."""
    model = target("llama")
    eagle = draftheads.build_drafter("eagle3", model, draft_vocab_size=128)
    # 3-token matches only: none in random tokens, so no lookup chain is grafted on
    stepwise, combined = copy.copy(eagle), CombinedDrafter(copy.copy(eagle), PromptLookupDrafter(min_ngram=3))
    stepwise.reset(), combined.reset()
    hidden = model.config.hidden_size * len(eagle.feature_layers)
    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(1, n, hidden, generator=g), torch.randint(model.config.vocab_size, (1, n), generator=g))
              for n in (9, 2, 1, 3)]
    for features, tokens in chunks:
        stepwise.observe(features, tokens)
        combined.observe(features, tokens)
    assert len(combined.unread) == 3                                     # the prompt was read at once, the rest waits
    ours, theirs = combined.propose(Tree.chain(3)), stepwise.propose(Tree.chain(3))
    assert ours.tokens.tolist() == theirs.tokens.tolist() and combined.unread == []
