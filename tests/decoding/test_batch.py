"""Speculative decoding of a batch: rows of different lengths, accepting different numbers of drafts, finishing
at different times, each exactly what decoding it alone gives (fp32 greedy), each row's KV cache what a fresh
prefill of its text gives, each row an independent draw from the target's law (strict)."""

from __future__ import annotations

import functools

import pytest
import torch

import draftheads
from draftheads.core.tree import Tree
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.decoder import Decoder
from draftheads.decoding.gate import GateCosts, LearnedGate
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.suffix import SuffixDrafter
from draftheads.decoding.settings import DecodeSettings
from tests.decoding.stubs import OracleDrafter, RandomDrafter
from tests.decoding.test_greedy import prompt_ids, target
from tests.decoding.test_strict import P_MIN, chi2_pvalue, small_target, two_token_law
from tests.fixtures import FAMILIES

# three prompts of different lengths (left padding), one repeating itself (prompt lookup finds matches)
PROMPTS = [prompt_ids()[0], prompt_ids()[0, 3:11], torch.cat([prompt_ids()[0, :6]] * 3)]
STATIC = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
KINDS = {
    "medusa": lambda model: draftheads.build_drafter("medusa", model, num_heads=3),
    "eagle": lambda model: draftheads.build_drafter("eagle", model, draft_vocab_size=128),
    "eagle3": lambda model: draftheads.build_drafter("eagle3", model, draft_vocab_size=128),
    "mtp": lambda model: draftheads.build_drafter("mtp", model, depth=3),
    "dflash": lambda model: draftheads.build_drafter("dflash", model, block_size=4),
    "peagle": lambda model: draftheads.build_drafter("peagle", model, depths=3, draft_vocab_size=128),
    "dspark": lambda model: draftheads.build_drafter("dspark", model, block_size=3, markov_rank=8),
    "lookup": lambda model: PromptLookupDrafter(),
    "suffix": lambda model: SuffixDrafter(),
    "combined": lambda model: CombinedDrafter(draftheads.build_drafter("eagle", model)),
    "switch": lambda model: CombinedDrafter(draftheads.build_drafter("eagle", model), switch=True),
    "gate": lambda model: CombinedDrafter(draftheads.build_drafter("eagle", model),
                                          gate=LearnedGate(GateCosts(0.3, 0.3))),
    "combined-dflash": lambda model: CombinedDrafter(draftheads.build_drafter("dflash", model, block_size=4)),
    "combined-dspark": lambda model: CombinedDrafter(draftheads.build_drafter("dspark", model, block_size=3,
                                                                              markov_rank=8), SuffixDrafter()),
    "combined-suffix": lambda model: CombinedDrafter(draftheads.build_drafter("eagle", model), SuffixDrafter()),
    "gate-suffix": lambda model: CombinedDrafter(draftheads.build_drafter("eagle", model), SuffixDrafter(),
                                                 gate=LearnedGate(GateCosts(0.3, 0.3))),
}
TREES = {"chain": "chain:3", "static": STATIC, "dynamic": "dynamic:3,3,8"}
STATIC_ONLY = {"medusa", "lookup"}


@functools.cache
def alone(family: str, index: int, max_new: int = 20) -> list[int]:
    return speculative_generate(target(family), None, PROMPTS[index], max_new, eos_token_id=[]).rows[0]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", TREES)
def test_greedy_batch_equals_each_prompt_alone(family, kind, shape):
    if shape == "dynamic" and kind in STATIC_ONLY:
        pytest.skip(f"{kind} drafts static trees")
    model = target(family)
    out = speculative_generate(model, KINDS[kind](model), PROMPTS, 20, tree=TREES[shape], eos_token_id=[])
    assert out.rows == [alone(family, i) for i in range(len(PROMPTS))]
    assert out.tokens.shape == (3, 20) and out.stats.prompts == 3 and out.stats.new_tokens == 60


def test_plain_decoding_of_a_batch_equals_each_prompt_alone():
    out = speculative_generate(target("qwen2"), None, PROMPTS, 20, eos_token_id=[])
    assert out.rows == [alone("qwen2", i) for i in range(len(PROMPTS))] and out.stats.tau == 1.0


def committed_cache(model, ids: list[int]):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=True).past_key_values


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("rule,temperature", [("greedy", 0.0), ("strict", 1.0)])
def test_every_rows_cache_equals_a_fresh_prefill_after_every_step(family, rule, temperature):
    model = target(family)
    drafters = OracleDrafter(model, int(PROMPTS[0][0]), noise=0.4, seed=2, tree=Tree.from_paths(STATIC))
    settings = DecodeSettings(rule, temperature, max_new_tokens=24, eos_token_id=[])
    decoder = Decoder(model, drafters, Tree.from_paths(STATIC), settings,
                      [torch.Generator().manual_seed(s) for s in range(3)])
    decoder.start(PROMPTS)
    accepted_differently = False
    while not decoder.done:
        decoder.step()
        accepted = [decoder.rows[i].stats.step_accepted[-1] for i in decoder.live]
        accepted_differently |= len(set(accepted)) > 1
        for r, i in enumerate(decoder.live):
            row = decoder.rows[i]
            fresh = committed_cache(model, PROMPTS[i].tolist() + row.generated[:-1])
            slots = decoder.valid[r].nonzero()[:, 0] if decoder.valid is not None else slice(None)
            for ours, theirs in zip(decoder.cache.layers, fresh.layers):
                torch.testing.assert_close(ours.keys[r, :, slots], theirs.keys[0], atol=1e-5, rtol=1e-4)
                torch.testing.assert_close(ours.values[r, :, slots], theirs.values[0], atol=1e-5, rtol=1e-4)
    assert accepted_differently  # the rows' caches really were ragged


def test_rows_finish_on_their_own_and_leave_the_batch():
    model = target("llama")
    # a token some row first emits late: that row stops there, rows without it run to the budget
    i, k = next((i, k) for k in range(20, 1, -1) for i in range(3)
                if alone("llama", i)[k - 1] not in alone("llama", i)[: k - 1])
    k, stop = k - 1, alone("llama", i)[k - 1]
    out = speculative_generate(model, RandomDrafter(model.config.vocab_size, tree=Tree.chain(3)), PROMPTS, 20,
                               eos_token_id=[stop])
    for r, row in enumerate(out.rows):
        expected = alone("llama", r)
        cut = expected.index(stop) + 1 if stop in expected else len(expected)
        assert row == expected[:cut]
    assert len(out.rows[i]) == k + 1 and len({len(row) for row in out.rows}) > 1


def test_plain_above_a_batch_size_and_speculation_below_it():
    model = target("llama")
    drafter = OracleDrafter(model, int(PROMPTS[0][0]), tree=Tree.chain(3))
    out = speculative_generate(model, drafter, [PROMPTS[0]] * 3, 12, eos_token_id=[], plain_above=2)
    assert out.rows == [alone("llama", 0, 12)] * 3
    assert all(n == 0 for s in out.row_stats for n in s.step_accepted)  # 3 rows live throughout: plain steps
    one = speculative_generate(model, drafter, [PROMPTS[0]], 12, eos_token_id=[], plain_above=2)
    assert max(one.stats.step_accepted) == 3  # one row: below the bound, it speculates


def test_strict_rows_of_a_batch_are_independent_draws_of_the_target():
    """The two-token joint law of plain sampling, from rows decoded 100 at a time with a poor sampled drafter."""
    model, prompt = small_target(), torch.tensor([2, 5, 7, 3, 9])
    drafter = RandomDrafter(16, sampled=True, tree=Tree.from_paths([(0,), (1,), (0, 0)]))
    counts, accepted = torch.zeros(16 * 16), 0
    for batch in range(12):
        seeds = list(range(batch * 100, (batch + 1) * 100))
        out = speculative_generate(model, drafter, [prompt] * 100, 2, accept="strict", temperature=0.8, top_k=6,
                                   top_p=0.9, seed=seeds, eos_token_id=[])
        for row in out.rows:
            counts[row[0] * 16 + row[1]] += 1
        accepted += sum(out.stats.step_accepted)
    assert 0 < accepted < 1200
    assert chi2_pvalue(counts, two_token_law(model, prompt[None], 0.8, 6, 0.9)) > P_MIN
