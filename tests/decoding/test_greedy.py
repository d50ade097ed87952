"""Greedy speculative decoding must reproduce plain greedy decoding token for token (fp32),
for every fixture family, sdpa and eager attention, chains and trees, any drafter."""

from __future__ import annotations

import functools

import pytest
import torch

from draftheads.core.tree import Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.suffix import SuffixDrafter
from tests.decoding.stubs import OracleDrafter, RandomDrafter
from tests.fixtures import FAMILIES, make_target, make_tokenizer

TREES = {"chain": Tree.chain(4),
         "tree": Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])}
PROMPT = "for i in range(10):\n    print(i * i)\nfor i in range(10):\n"


@functools.cache
def target(family: str, attn: str = "sdpa"):
    return make_target(family, make_tokenizer(), attn=attn)


@functools.cache
def prompt_ids() -> torch.Tensor:
    return torch.tensor([make_tokenizer()(PROMPT)["input_ids"]])


def make_drafter(kind: str, model, tree):
    ids = prompt_ids()
    if kind == "random":
        return RandomDrafter(model.config.vocab_size, seed=3, tree=tree)
    if kind == "oracle":
        return OracleDrafter(model, int(ids[0, 0]), tree=tree)
    if kind == "noisy":
        return OracleDrafter(model, int(ids[0, 0]), noise=0.3, seed=1, tree=tree)
    if kind == "suffix":   # grows its own trees within the one it is given
        return SuffixDrafter(max_nodes=tree.num_nodes - 1, max_match=max(1, 24 - tree.depth))
    return PromptLookupDrafter(tree=tree)


@functools.cache
def plain(family: str, attn: str, max_new: int, eos=()):
    return speculative_generate(target(family, attn), None, prompt_ids(), max_new, eos_token_id=list(eos))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", TREES)
@pytest.mark.parametrize("kind", ["random", "oracle", "noisy", "lookup", "suffix"])
def test_greedy_matches_plain(kind, shape, family, attn):
    model = target(family, attn)
    drafter = make_drafter(kind, model, TREES[shape])
    out = speculative_generate(model, drafter, prompt_ids(), 40, eos_token_id=[])
    assert out.tokens.tolist() == plain(family, attn, 40).tokens.tolist()
    assert out.stats.new_tokens == 40 and sum(out.stats.step_emitted) == 39  # the first token comes from the prefill
    if kind == "oracle":  # every draft right: each step emits a whole root-to-leaf path plus the bonus token
        assert all(n == TREES[shape].depth + 1 for n in out.stats.step_emitted[:-1])


def test_plain_loop_matches_transformers_generate():
    model = target("llama")
    ids = prompt_ids()
    reference = model.generate(ids, max_new_tokens=25, do_sample=False, eos_token_id=None)
    assert plain("llama", "sdpa", 25).tokens.tolist() == reference[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("max_new", [1, 2, 5, 13])
def test_stops_at_max_new_tokens_like_plain(max_new):
    model = target("qwen2")
    out = speculative_generate(model, OracleDrafter(model, int(prompt_ids()[0, 0]), tree=TREES["tree"]), prompt_ids(),
                               max_new, eos_token_id=[])
    assert out.tokens.tolist() == plain("qwen2", "sdpa", 40).tokens[:, :max_new].tolist()


@pytest.mark.parametrize("at", [0, 1, 6, 11])
def test_stops_at_eos_like_plain(at):
    """Make the token plain decoding emits at position `at` the EOS: speculative decoding (whose oracle drafts
    run through it) must stop right there, never past it."""
    model = target("mistral")
    reference = plain("mistral", "sdpa", 40).tokens[0].tolist()
    eos = reference[at]
    stop = reference.index(eos)  # the first occurrence is where plain decoding stops
    expected = plain("mistral", "sdpa", 40, (eos,)).tokens[0].tolist()
    assert expected == reference[: stop + 1]
    drafter = OracleDrafter(model, int(prompt_ids()[0, 0]), tree=TREES["chain"])
    out = speculative_generate(model, drafter, prompt_ids(), 40, eos_token_id=eos)
    assert out.tokens[0].tolist() == expected


def test_default_eos_comes_from_the_target():
    model = target("llama")
    reference = plain("llama", "sdpa", 40).tokens[0].tolist()
    with_eos = speculative_generate(model, RandomDrafter(model.config.vocab_size), prompt_ids(), 40).tokens[0].tolist()
    eos = model.generation_config.eos_token_id
    assert with_eos == (reference[: reference.index(eos) + 1] if eos in reference else reference)
