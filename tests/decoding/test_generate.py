"""speculative_generate as a public API: wiring, validation, seeds, and the statistics it returns."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.generate import generate, speculative_generate
from draftheads.decoding.settings import DecodeSettings
from draftheads.decoding.stats import GenerationStats
from tests.decoding.stubs import OracleDrafter, RandomDrafter
from tests.decoding.test_greedy import plain, prompt_ids, target

TREE = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])


def oracle(noise=0.3, tree=TREE):
    return OracleDrafter(target("llama"), int(prompt_ids()[0, 0]), noise=noise, seed=5, tree=tree)


def test_public_api_delegates_here():
    out = draftheads.speculative_generate(target("llama"), oracle(), prompt_ids()[0], max_new_tokens=12,
                                          eos_token_id=[])
    assert out.tokens.shape == (1, 12) and out.tokens.dtype == torch.long
    assert out.tokens.tolist() == plain("llama", "sdpa", 40).tokens[:, :12].tolist()


def test_the_keywords_are_one_settings_object_with_its_defaults():
    """speculative_generate is generate with its DecodeSettings given as keywords: the same defaults (read from the
    class, written once) and the same tokens."""
    keywords = {name: p.default for name, p in inspect.signature(speculative_generate).parameters.items()}
    defaults = DecodeSettings()
    assert [keywords[name] for name in ("accept", "temperature", "top_k", "top_p", "max_new_tokens", "typical_epsilon",
                                        "typical_delta", "eos_token_id")] == [
        defaults.rule, defaults.temperature, defaults.top_k, defaults.top_p, defaults.max_new_tokens,
        defaults.typical_epsilon, defaults.typical_delta, defaults.eos_token_id]
    settings = DecodeSettings(rule="strict", temperature=0.9, top_k=20, max_new_tokens=16, eos_token_id=[])
    given = generate(target("llama"), RandomDrafter(384, sampled=True, tree=TREE), prompt_ids(), settings, seed=3)
    keyworded = speculative_generate(target("llama"), RandomDrafter(384, sampled=True, tree=TREE), prompt_ids(), 16,
                                     accept="strict", temperature=0.9, top_k=20, eos_token_id=[], seed=3)
    assert given.tokens.tolist() == keyworded.tokens.tolist()


def test_at_temperature_zero_the_rule_asked_for_runs_as_greedy():
    settings = DecodeSettings(rule="typical", temperature=0.0)
    assert settings.rule == "typical" and settings.applied_rule == "greedy"
    assert DecodeSettings(rule="typical", temperature=0.5).applied_rule == "typical"


@pytest.mark.parametrize("rule", ["strict", "typical"])
def test_sampling_rules_at_temperature_zero_reproduce_plain_greedy(rule):
    out = speculative_generate(target("llama"), oracle(), prompt_ids(), 30, accept=rule, temperature=0.0,
                               eos_token_id=[])
    assert out.tokens.tolist() == plain("llama", "sdpa", 40).tokens[:, :30].tolist()


@pytest.mark.parametrize("rule", ["strict", "typical"])
def test_same_seed_same_tokens(rule):
    kw = dict(accept=rule, temperature=1.0, top_p=0.95, eos_token_id=[])
    runs = [speculative_generate(target("llama"), RandomDrafter(384, sampled=True, tree=TREE), prompt_ids(), 20,
                                 seed=s, **kw) for s in (1, 1, 2)]
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist() != runs[2].tokens.tolist()


def test_dynamic_tree_specs_reach_the_drafter_and_its_tree_is_verified():
    out = speculative_generate(target("llama"), oracle(0.0, tree=None), prompt_ids(), 20, tree="dynamic:2,3,6",
                               eos_token_id=[])
    assert out.tokens.tolist() == plain("llama", "sdpa", 40).tokens[:, :20].tolist()
    assert set(out.stats.step_nodes) == {7} and len(out.stats.drafted) == 3


@pytest.mark.parametrize("kwargs,match", [
    (dict(accept="lossless"), "acceptance rule"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(tree="chain:0"), "tree spec"),
    (dict(tree=[]), "no draft nodes"),
    (dict(typical_epsilon=0.0), "typical_epsilon"),
])
def test_bad_arguments_are_one_line_errors(kwargs, match):
    with pytest.raises(DraftheadsError, match=match):
        speculative_generate(target("llama"), oracle(), prompt_ids(), **({"max_new_tokens": 5} | kwargs))


def test_non_drafters_and_seed_counts_that_do_not_fit_are_refused():
    with pytest.raises(DraftheadsError, match="one seed per prompt"):
        speculative_generate(target("llama"), oracle(), prompt_ids().expand(2, -1), 5, seed=[1, 2, 3])
    with pytest.raises(DraftheadsError, match="not a drafter"):
        speculative_generate(target("llama"), object(), prompt_ids(), 5)


def test_stats_count_what_happened_and_merge_over_prompts():
    model = target("llama")
    chain = Tree.chain(3)
    a = speculative_generate(model, oracle(0.0, tree=chain), prompt_ids(), 21, eos_token_id=[]).stats
    assert a.step_emitted == [4] * 5 and a.step_accepted == [3] * 5 and a.tau == 4.0
    assert a.drafted == [5, 5, 5] and a.reached == [5, 5, 5] and a.accepted == [5, 5, 5]
    assert a.acceptance_rates == [1.0, 1.0, 1.0] and a.rank_accuracy == [[1.0], [1.0], [1.0]]
    b = speculative_generate(model, RandomDrafter(384, tree=chain), prompt_ids(), 6, eos_token_id=[]).stats
    assert b.step_accepted == [0] * 5 and b.acceptance_rates == [0.0, 0.0, 0.0]
    both = GenerationStats.merged([a, b])
    assert both.prompts == 2 and both.new_tokens == 27 and both.steps == 10
    assert both.tau == pytest.approx((20 + 5) / 10) and both.acceptance_rates == [0.5, 1.0, 1.0]
    assert both.drafted == [10, 10, 10] and both.draft_s == pytest.approx(a.draft_s + b.draft_s)
    assert all(t > 0 for t in both.step_verify_s) and both.prefill_s > 0 and both.total_s >= both.decode_s
    json.dumps(both.summary())


def test_plain_decoding_stats_are_the_baseline():
    stats = plain("llama", "sdpa", 40).stats
    assert stats.steps == 39 and stats.tau == 1.0 and stats.drafted == [] and stats.draft_s == 0.0
    assert stats.mean_verify_s > 0 and stats.tokens_per_s > 0


def test_flash_attention_targets_are_refused_with_the_fix():
    from tests.fixtures import make_target, make_tokenizer

    model = make_target("llama", make_tokenizer())
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(DraftheadsError, match="attn_implementation='sdpa'"):
        speculative_generate(model, None, prompt_ids(), 3)


def test_bad_api_inputs_are_one_line_errors():
    """A token id outside the vocabulary, a NaN temperature, a drafter built for another target."""
    import draftheads
    from tests.fixtures import make_target

    target, other = make_target("llama"), make_target("llama", hidden_size=32)
    vocab = target.config.vocab_size
    cases = [
        (dict(input_ids=[[1, 2, vocab]]), f"token id {vocab}, outside the target's vocabulary"),
        (dict(input_ids=[[1, -3, 2]]), "token id -3"),
        (dict(input_ids=[[1, 2, 3]], accept="strict", temperature=float("nan")),
         "temperature nan is not a finite number"),
        (dict(input_ids=[[1, 2, 3]], drafter=draftheads.build_drafter("medusa", other)),
         "built for a target with hidden size 32"),
        (dict(input_ids=[[1, 2, 3]], drafter=draftheads.build_drafter("eagle", other)),
         "built for a target with hidden size 32"),
    ]
    for kwargs, message in cases:
        kwargs.setdefault("drafter", None)
        with pytest.raises(DraftheadsError, match=message) as info:
            speculative_generate(target, kwargs.pop("drafter"), kwargs.pop("input_ids"), 4, **kwargs)
        assert "\n" not in str(info.value)
