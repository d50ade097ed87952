"""The real (untrained, random) drafters through the generation loop: greedy output equals plain greedy
decoding for every head type x fixture family x chain / static tree / default (dynamic) tree, and the
sampling rules run with the drafters' own q."""

from __future__ import annotations

import pytest

import draftheads
from draftheads.decoding.generate import speculative_generate
from tests.decoding.test_greedy import plain, prompt_ids, target
from tests.fixtures import FAMILIES

VARIANTS = {
    "medusa": ("medusa", {"num_heads": 3}),
    "medusa-vocab": ("medusa", {"num_heads": 3, "draft_vocab_size": 128}),
    "eagle": ("eagle", {}),
    "eagle-vocab": ("eagle", {"draft_vocab_size": 128}),
    "eagle3": ("eagle3", {"draft_vocab_size": 128}),
    "mtp": ("mtp", {"depth": 2}),
    "mtp-vocab": ("mtp", {"depth": 2, "draft_vocab_size": 128}),
    "dflash": ("dflash", {"block_size": 4}),
    "dflash-vocab": ("dflash", {"num_layers": 2, "draft_vocab_size": 128}),
    "peagle": ("peagle", {"depths": 3, "draft_vocab_size": 128}),
    "dspark": ("dspark", {"block_size": 3, "markov_rank": 8}),
    "dspark-vocab": ("dspark", {"num_layers": 2, "draft_vocab_size": 128, "markov_rank": 8}),
}
TREES = {"chain": "chain:2", "tree": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)], "default": None}


def drafter(name: str, model):
    kind, cfg = VARIANTS[name]
    return draftheads.build_drafter(kind, model, **cfg)


@pytest.mark.parametrize("shape", TREES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_with_real_drafters_matches_plain(name, family, shape):
    model = target(family)
    out = speculative_generate(model, drafter(name, model), prompt_ids(), 24, tree=TREES[shape], eos_token_id=[])
    assert out.tokens.tolist() == plain(family, "sdpa", 40).tokens[:, :24].tolist()


@pytest.mark.parametrize("rule", ["strict", "typical"])
@pytest.mark.parametrize("name", VARIANTS)
def test_sampling_rules_run_with_real_drafters(name, rule):
    model = target("qwen2")
    out = speculative_generate(model, drafter(name, model), prompt_ids(), 16, accept=rule, temperature=0.9, top_p=0.95,
                               eos_token_id=[], seed=3)
    assert out.tokens.shape == (1, 16) and sum(out.stats.step_emitted) == 15
