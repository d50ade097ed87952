"""Family conventions that fail silently rather than loudly: a wrong rope base, a missing embedding scale or softcap
only lowers acceptance. A draft layer made as a copy of the target's last decoder layer, run by our own layer call
(heads/parts/layers.run_layer) with the rotary core/target_family builds for it, fed the target's own features, must
give the target's last hidden state and logits (through TargetHead); TargetEmbedding must give what its first layer
reads."""

from __future__ import annotations

import copy

import pytest
import torch

from draftheads.core.target_family import (
    TargetEmbedding,
    TargetHead,
    attention_kernel,
    global_layer,
    layer_rotary,
    layer_type,
    recurrent_layers,
    sliding_windows,
    whole_head_rope,
)
from draftheads.heads.parts.layers import build_decoder_layer, causal_visible, run_layer
from tests.families import FAMILIES, HYBRID, family_config, family_target
from tests.margins import at_most

TOLERANCE = 1e-4   # fp32 over a 4-layer, hidden-64 model: a wrong convention moves the logits by 1e-1 or more


def layer_inputs(target, ids: torch.Tensor, index: int) -> dict:
    """What the model hands layer `index` beside its hidden states: Gemma 4's per-layer input embeddings."""
    model = target.get_decoder()
    if not getattr(model.config, "hidden_size_per_layer_input", 0):
        return {}
    embeds = model.embed_tokens(ids)
    per_layer = model.project_per_layer_inputs(embeds, model.get_per_layer_inputs(ids, embeds))
    return {"per_layer_input": per_layer[:, :, index, :]}


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_a_copy_of_the_last_layer_gives_the_targets_hidden_state_and_logits(family):
    target = family_target(family)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    out = target(ids, output_hidden_states=True)
    decoder = target.get_decoder()
    index = len(decoder.layers) - 1
    layer = copy.deepcopy(decoder.layers[index])
    hidden = run_layer(layer, layer_rotary(layer), out.hidden_states[-2], torch.arange(12)[None],
                       causal_visible(None, 1, 12), **layer_inputs(target, ids, index))
    final = decoder.norm(hidden)
    logits = TargetHead(target.get_output_embeddings(), target.config)(final)
    at_most((final - out.hidden_states[-1]).abs().max().item(), TOLERANCE, f"{family}: last hidden state")
    at_most((logits - out.logits).abs().max().item(), TOLERANCE, f"{family}: logits")
    embedded = TargetEmbedding(target.get_input_embeddings(), target.config)(ids)
    at_most((embedded - out.hidden_states[0]).abs().max().item(), TOLERANCE, f"{family}: embedding")


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_a_draft_layer_built_for_the_target_computes_its_global_layer(family):
    """The draft layer EAGLE and MTP build (heads/parts/layers.build_decoder_layer: one layer of the target's class from
    one_layer_config), given the weights of the target layer it is modelled on (global_layer), computes what that
    layer computes: its sizes, rotary and attention settings are the target's. Where the target's first layers are
    dense and the rest MoE (GLM-4.5, DeepSeek-V3) the draft layer is a dense one, modelled on the last dense layer;
    Gemma 4 without per-layer inputs, which a draft layer does not take."""
    target = family_target(family, **({"hidden_size_per_layer_input": 0} if family == "gemma4" else {}))
    decoder = target.get_decoder()
    layer = build_decoder_layer(target.config)
    same_shape = [i for i, other in enumerate(decoder.layers) if other.state_dict().keys() == layer.state_dict().keys()]
    index = global_layer(target.config) if global_layer(target.config) in same_shape else same_shape[-1]
    layer.load_state_dict(decoder.layers[index].state_dict())
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    states = target(ids, output_hidden_states=True).hidden_states
    hidden = run_layer(layer, layer_rotary(layer), states[index], torch.arange(12)[None], causal_visible(None, 1, 12))
    if index == len(decoder.layers) - 1:   # the last layer's output is reported after the final norm
        hidden = decoder.norm(hidden)
    at_most((hidden - states[index + 1]).abs().max().item(), TOLERANCE, f"{family}: built draft layer")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_parameter_of_a_draft_layer_is_initialised(family):
    """MoE experts and routers are torch.empty in transformers' constructors, initialised only by the model's
    _init_weights: a draft layer built on its own held whatever memory it got (a Mixtral EAGLE drafter trained to NaN
    on one machine and not on another). Built here with torch.empty's memory filled with NaN, so anything left
    uninitialised shows; built twice from one seed, it is the same layer."""
    target = family_target(family)
    deterministic = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        layers = []
        for _ in range(2):
            torch.manual_seed(0)
            layers.append(build_decoder_layer(target.config))
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = fill
    for name, p in layers[0].named_parameters():
        assert torch.isfinite(p).all(), f"{family}: {name} left uninitialised"
        assert p.abs().max() < 10, f"{family}: {name} initialised out of scale"
        assert torch.equal(p, layers[1].get_parameter(name)), f"{family}: {name} differs between two builds"


@torch.no_grad()
def test_each_convention_left_out_would_be_caught():
    """The checks above are not vacuous: Gemma 3's local rotary on its global layer, Gemma 2's lm_head without its
    softcap, Cohere 2's and Granite's without their scales, Granite's embedding without its multiplier each move
    the figures by far more than the tolerance."""
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    gemma3 = family_target("gemma3_text")
    out = gemma3(ids, output_hidden_states=True)
    layer = copy.deepcopy(gemma3.get_decoder().layers[-1])
    rotary = layer_rotary(layer)
    rotary.layer_type = "sliding_attention"
    hidden = run_layer(layer, rotary, out.hidden_states[-2], torch.arange(12)[None], causal_visible(None, 1, 12))
    assert (gemma3.get_decoder().norm(hidden) - out.hidden_states[-1]).abs().max() > 100 * TOLERANCE
    for family in ("gemma2", "cohere2", "granite"):
        target = family_target(family)
        out = target(ids, output_hidden_states=True)
        plain = target.get_output_embeddings()(out.hidden_states[-1])
        assert (plain - out.logits).abs().max() > 100 * TOLERANCE, family
    granite = family_target("granite")
    raw = granite.get_input_embeddings()(ids)
    assert (raw - granite(ids, output_hidden_states=True).hidden_states[0]).abs().max() > 100 * TOLERANCE


def test_conventions_read_from_the_configs():
    gemma2 = family_config("gemma2", 384)
    assert sliding_windows(gemma2) == (64, False) and layer_type(gemma2, 1) == "full_attention"
    assert sliding_windows(family_config("mistral", 384, sliding_window=32)) == (32, True)
    assert sliding_windows(family_config("llama", 384)) == (None, False)
    for family in HYBRID:
        assert recurrent_layers(family_config(family, 384)) == [0, 1, 2]
    # a Llama draft layer rotates whole heads at the base of the global layers
    assert whole_head_rope(family_config("qwen3_next", 384)) == {"rope_theta": 10000.0, "rope_type": "default"}
    assert whole_head_rope(family_config("gemma3_text", 384))["rope_theta"] == 1_000_000.0
    from transformers import Gemma2ForCausalLM, LlamaForCausalLM

    assert attention_kernel(Gemma2ForCausalLM, "sdpa") == "eager"
    assert attention_kernel(LlamaForCausalLM, "sdpa") == "sdpa"
