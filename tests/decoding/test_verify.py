"""Tree verification equals separate plain forwards, numerically; the compacted cache equals the cache
plain decoding builds; the drafter sees the target's true features of the committed tokens."""

from __future__ import annotations

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.decoder import Decoder
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.settings import DecodeSettings
from draftheads.decoding.verify import compact_cache, new_cache, prefill, verify
from tests.decoding.stubs import OracleDrafter, RecordingDrafter
from tests.decoding.test_greedy import prompt_ids, target
from tests.fixtures import FAMILIES

TREE = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
ATOL = 1e-4


def plain_forward(model, ids: torch.Tensor):
    """Logits [1, s, V], hidden states and cache of one plain causal forward over ids [1, s]."""
    cache = new_cache(model)
    out = model(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=True)
    return out.logits, out.hidden_states, cache


def assert_same_cache(cache, reference):
    assert cache.get_seq_length() == reference.get_seq_length()
    for layer, ref in zip(cache.layers, reference.layers):
        torch.testing.assert_close(layer.keys, ref.keys, atol=ATOL, rtol=0)
        torch.testing.assert_close(layer.values, ref.values, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_tree_logits_equal_path_forwards_and_cache_compacts(family, attn):
    model = target(family, attn)
    prompt = prompt_ids()[:, :12]
    tokens = torch.randint(model.config.vocab_size, (1, TREE.num_nodes), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model)
    prefill(model, prompt, cache)
    out = verify(model, cache, tokens, TREE, feature_layers=(1, -1))
    for node in range(TREE.num_nodes):
        ids = torch.cat([prompt, tokens[:, TREE.ancestors(node)]], 1)
        logits, hidden, _ = plain_forward(model, ids)
        torch.testing.assert_close(out.logits[:, node], logits[:, -1], atol=ATOL, rtol=0)
        torch.testing.assert_close(out.features[:, node], torch.cat([hidden[1][:, -1], hidden[-1][:, -1]], -1),
                                   atol=ATOL, rtol=0)
    path = torch.tensor(TREE.ancestors(TREE.num_nodes - 1))   # root -> deepest node
    compact_cache(cache, TREE.num_nodes, path)
    assert_same_cache(cache, plain_forward(model, torch.cat([prompt, tokens[:, path]], 1))[2])


@pytest.mark.parametrize("rule,temperature", [("greedy", 0.0), ("strict", 1.0), ("typical", 0.7)])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cache_after_every_step_equals_plain_decoding_cache(family, rule, temperature):
    model = target(family)
    ids = prompt_ids()
    drafter = OracleDrafter(model, int(ids[0, 0]), noise=0.3, seed=2, tree=TREE)
    settings = DecodeSettings(rule=rule, temperature=temperature, max_new_tokens=30, eos_token_id=[])
    decoder = Decoder(model, drafter, TREE, settings, [torch.Generator().manual_seed(0)])
    decoder.start([ids[0]])
    row = decoder.rows[0]
    while not decoder.done:
        decoder.step()
        if not decoder.done:
            committed = torch.cat([ids, torch.tensor([row.generated[:-1]])], 1)
            assert_same_cache(decoder.cache, plain_forward(model, committed)[2])
            assert decoder.pending.tolist() == row.generated[-1:]
    assert max(row.stats.step_accepted) >= 2 and min(row.stats.step_accepted) == 0


@pytest.mark.parametrize("layers", [(-1,), (0, 2, -1)])
def test_drafter_observes_true_features_of_committed_tokens(layers):
    model = target("qwen2")
    ids = prompt_ids()
    drafter = RecordingDrafter(model.config.vocab_size, feature_layers=layers, tree=TREE)
    out = speculative_generate(model, drafter, ids, 25, eos_token_id=[], accept="strict", temperature=1.0)
    generated = out.tokens[0].tolist()
    observed = len(generated) - out.stats.step_emitted[-1]   # the last step's tokens end the run unobserved
    seen_tokens = torch.cat(drafter.next_tokens, 1)
    assert seen_tokens[0].tolist() == ids[0, 1:].tolist() + generated[:observed]
    features = torch.cat(drafter.features, 1)
    _, hidden, _ = plain_forward(model, torch.cat([ids, out.tokens[:, : observed - 1]], 1))
    expected = torch.cat([hidden[i] for i in layers], -1)
    assert features.shape == expected.shape
    torch.testing.assert_close(features, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", ["mistral", "gemma3_text", "cohere2"])
def test_sliding_window_targets_decode_past_the_window_as_transformers_does(family):
    """Every layer slides (Mistral) or local layers mix with global ones (Gemma 3, Cohere 2), with a window of 16 and
    60 positions: plain decoding through our loop (a cache that keeps every position, windowed masks) equals
    transformers' own generate (its sliding caches drop what falls out), and a tree verified over the same cache
    keeps the output."""
    from tests.families import family_target

    model = family_target(family, sliding_window=16)
    ids = prompt_ids()
    reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=50, do_sample=False)
    plain = speculative_generate(model, None, ids, 50, eos_token_id=[])
    assert plain.tokens.tolist() == reference[:, ids.shape[1]:].tolist()
    drafter = OracleDrafter(model, int(ids[0, 0]), noise=0.3, seed=1, tree=TREE)
    assert speculative_generate(model, drafter, ids, 50, eos_token_id=[]).tokens.tolist() == plain.tokens.tolist()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_drafters_catch_up_on_what_plain_steps_committed_with_its_true_features(family):
    """Above plain_above live rows a step is plain and shows the drafters nothing; once rows finish, one forward over
    what was committed meanwhile hands each remaining drafter the features it would have seen step by step: three
    left-padded rows with budgets 6, 14 and 30 and plain_above 1, so the last row decodes plainly, catches up, then
    speculates."""
    from tests.decoding.test_batch import PROMPTS

    model = target(family)
    drafter = RecordingDrafter(model.config.vocab_size, feature_layers=(1, -1), tree=TREE, seed=4)
    settings = DecodeSettings(rule="greedy", temperature=0.0, max_new_tokens=30, eos_token_id=[])
    decoder = Decoder(model, drafter, TREE, settings, [torch.Generator().manual_seed(s) for s in range(3)],
                      max_new_tokens=[6, 14, 30], plain_above=1)
    drafters = [row.drafter for row in decoder.rows]
    decoder.start(list(PROMPTS))
    while not decoder.done:
        decoder.step()
    last = decoder.rows[2]
    assert last.stats.step_nodes[:5] == [1] * 5 and last.stats.step_nodes[-1] == TREE.num_nodes   # plain, then not
    for prompt, row, drafter in zip(PROMPTS, decoder.rows, drafters):
        seen = torch.cat(drafter.next_tokens, 1)[0].tolist()
        text = prompt.tolist() + row.generated
        assert seen == text[1 : 1 + len(seen)]
        _, hidden, _ = plain_forward(model, torch.tensor([text[: len(seen)]]))
        torch.testing.assert_close(torch.cat(drafter.features, 1), torch.cat([hidden[1], hidden[-1]], -1),
                                   atol=ATOL, rtol=0)
    assert len(torch.cat(drafters[2].next_tokens, 1)[0]) > len(PROMPTS[2]) + 14   # it caught up past the plain steps
