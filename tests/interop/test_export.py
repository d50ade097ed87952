"""Export to engine layouts and import back.

Round trips (native -> engine folder -> load_drafter) must give the same weights and the same
drafts; conformance checks compare every exported key, shape, dtype and config field with what
the engines' loaders expect, written down here independently of the layouts in interop/; an
engine-semantics check recomputes drafts the way the engine's forward does, from the exported
tensors alone; refused combinations fail with a one-line error that lists the allowed formats.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from draftheads.api import build_drafter, load_drafter
from draftheads.core.config import build, to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import parse_tree
from draftheads.heads.factory import KINDS
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter
from tests.fixtures import FAMILIES as TEST_FAMILIES
from tests.fixtures import make_target

FAMILIES = TEST_FAMILIES + ("gemma",)   # every family a tiny config builds; the exports are checked for each

H, V, I, Q, KV, D = 64, 384, 128, 64, 32, 16  # tiny fixture: hidden 64, 4 heads / 2 kv heads of 16, MLP 128
VD = 100  # EAGLE-3 draft vocabulary used here

HEADS = {
    "medusa-shared": ("medusa", {"num_heads": 3, "num_layers": 1}),
    "medusa-own": ("medusa", {"num_heads": 2, "num_layers": 2, "lm_head": "own"}),
    "medusa-own-vocab": ("medusa", {"num_heads": 2, "num_layers": 1, "lm_head": "own", "draft_vocab_size": VD}),
    "eagle": ("eagle", {}),
    "eagle3": ("eagle3", {"draft_vocab_size": VD}),                  # the Llama draft layer (default)
    "eagle3-own": ("eagle3", {"draft_vocab_size": VD, "draft_layer": "target"}),   # the target's class
    "dflash": ("dflash", {"block_size": 4, "num_layers": 2}),
    "dflash-vocab": ("dflash", {"draft_vocab_size": VD}),
    "peagle": ("peagle", {"draft_vocab_size": VD, "depths": 3}),
    "dspark": ("dspark", {"block_size": 3, "num_layers": 2, "draft_vocab_size": VD, "markov_rank": 8}),
    "dspark-full": ("dspark", {"block_size": 3, "num_layers": 2, "markov_rank": 8}),   # DeepSpec's whole vocabulary
}
# Which engine formats each head type may go to, per target family (everything else is refused).
ALLOWED = {
    "medusa-shared": {f: ("vllm", "tgi") for f in FAMILIES},
    "medusa-own": {f: ("vllm", "tgi") for f in FAMILIES},
    "medusa-own-vocab": {f: ("vllm",) for f in FAMILIES},  # vLLM's token_map; TGI's own heads are full-vocabulary
    "eagle": {"llama": ("vllm", "sglang"), "mistral": ("vllm", "sglang"), "qwen2": ("vllm", "sglang"), "qwen3": (),
              "gemma": ()},
    # a Llama draft layer goes to every EAGLE-3 engine whose class for the target gives its hidden states (SGLang's
    # Gemma 1 class does not; vLLM runs Gemma 1 on its Transformers backend, which does); a layer of the target's
    # class only where the engine has that class
    "eagle3": {f: ("vllm",) + (("sglang",) if f != "gemma" else ()) + ("speculators", "llama.cpp") for f in FAMILIES},
    "eagle3-own": {"llama": ("vllm", "sglang", "speculators", "llama.cpp"),
                   "mistral": ("vllm", "sglang", "speculators", "llama.cpp"),
                   "qwen2": (), "qwen3": ("speculators",), "gemma": ()},
    # the z-lab layout: Qwen3-style layers of the target's sizes, where the engine's class for the target gives its
    # hidden states (SGLang's Qwen2 and Gemma 1 classes do not); SGLang drafts over the whole vocabulary (the target
    # lm_head's rows are the weights either way)
    # (and llama.cpp, through its converter: interop/llama_cpp_block.py, checked by the engine tests)
    "dflash": {f: ("vllm", "sglang", "speculators", "llama.cpp") if f in ("llama", "mistral", "qwen3")
               else ("vllm", "speculators", "llama.cpp") for f in FAMILIES},
    "dflash-vocab": {f: ("vllm", "sglang", "speculators", "llama.cpp") if f in ("llama", "mistral", "qwen3")
                     else ("vllm", "speculators", "llama.cpp") for f in FAMILIES},
    # EAGLE-3's Llama layer with a mask vector: vLLM (parallel_drafting) and speculators; SGLang has no P-EAGLE
    "peagle": {f: ("vllm", "speculators") for f in FAMILIES},
    # DFlash's folder with the Markov and confidence heads: vLLM's dspark method (DeepSpec's layout, a draft
    # vocabulary as lm_head rows and d2t), speculators, and llama.cpp through its converter; DeepSpec's own layout
    # only over the whole vocabulary (SGLang is not written)
    "dspark": {f: ("vllm", "speculators", "llama.cpp") for f in FAMILIES},
    "dspark-full": {f: ("vllm", "speculators", "deepspec", "llama.cpp") for f in FAMILIES},
}
ENGINE_FORMATS = ("vllm", "sglang", "tgi", "speculators", "deepseek-mtp", "deepspec", "llama.cpp")


@pytest.fixture(scope="module")
def targets(tmp_path_factory, tokenizer):
    """family -> a tiny target saved to disk and named by its folder (TGI and speculators need a name)."""
    out = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(f"target-{family}")
        model = make_target(family, tokenizer)
        model.save_pretrained(folder)
        model.config._name_or_path = str(folder)
        out[family] = model
    return out


@pytest.fixture(scope="module")
def natives(targets, tmp_path_factory):
    """(family, head) -> (drafter with randomised weights, its native folder)."""
    cache = {}

    def get(family, head):
        if (family, head) not in cache:
            target = targets[family]
            kind, cfg = HEADS[head]
            torch.manual_seed(3)
            drafter = build_drafter(kind, target, **cfg)
            if head == "medusa-own-vocab":  # before the noise: choosing restarts the own heads as the target's rows
                drafter.set_draft_vocab(torch.randint(0, 1000, (V,)))
            with torch.no_grad():  # zero-initialised blocks would hide swapped or dropped tensors
                for p in drafter.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            if head.startswith("eagle3") or head in ("dflash-vocab", "peagle", "dspark"):
                # keeps the noisy lm_head: no restart from the target
                drafter.vocab.choose(torch.randint(0, 1000, (V,)))
            folder = save_drafter(drafter, tmp_path_factory.mktemp(f"{family}-{head}") / "native", target=target)
            cache[family, head] = drafter, folder
        return cache[family, head]

    return get


def features_for(drafter, target, ids):
    """(features [1, n, F], next tokens [1, n]) for the prompt `ids`, as the generation loop feeds them."""
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    features = torch.cat([out.hidden_states[i] for i in drafter.feature_layers], dim=-1)
    pending = out.logits[:, -1].argmax(-1, keepdim=True)
    return features, torch.cat([ids[:, 1:], pending], dim=1)


PROMPT = torch.tensor([[5, 17, 42, 99, 7, 23, 61, 11]])


def drafts(drafter, observed, seed=None):
    """Greedy (seed None) or sampled proposals after observing the prompt: (paths, tokens, q)."""
    drafter.reset()
    drafter.observe(*observed)
    kwargs = {} if seed is None else {"temperature": 1.0, "generator": torch.Generator().manual_seed(seed)}
    tree = drafter.default_tree if drafter.config.type == "medusa" else parse_tree("dynamic:4,3,10")  # small: CPU time
    proposal = drafter.propose(tree, **kwargs)
    return proposal.tree.paths, proposal.tokens, proposal.q


# llama.cpp's GGUF is not read back here: tests/interop/test_llama_cpp.py and the engine itself check it
# (SGLang's DFlash drafts over the whole vocabulary: test_dflash_draft_vocabulary_stays_with_vllm)
CASES = [(family, head, fmt) for head, per in ALLOWED.items() for family, fmts in per.items() for fmt in fmts
         if fmt != "llama.cpp" and (head, fmt) != ("dflash-vocab", "sglang")]


@pytest.mark.parametrize("family,head,fmt", CASES, ids=["-".join(c) for c in CASES])
def test_round_trip_keeps_weights_and_drafts(family, head, fmt, targets, natives, tmp_path):
    target = targets[family]
    drafter, native = natives(family, head)
    loaded = load_drafter(export_drafter(native, fmt, tmp_path / fmt), target)

    assert type(loaded) is type(drafter)
    assert to_dict(loaded.config) == to_dict(drafter.config)
    assert build(KINDS[drafter.config.type][0], to_dict(loaded.config), "head") == loaded.config  # head.init_from
    assert all(p.requires_grad for p in loaded.parameters())
    a, b = drafter.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        # vLLM's EAGLE-1 layout re-expresses the fc bias through the attention biases (float64 math)
        tol = 1e-6 if (fmt, head) == ("vllm", "eagle") else 0.0
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=tol, msg=key)
    observed = features_for(drafter, target, PROMPT)
    for seed in (None, 7):
        paths, tokens, q = drafts(drafter, observed, seed)
        paths2, tokens2, q2 = drafts(loaded, observed, seed)
        assert paths == paths2 and torch.equal(tokens, tokens2)
        assert (q is None) == (q2 is None) and (q is None or torch.allclose(q, q2, atol=1e-6))


# ---- conformance: what each loader reads, written down from its source -------------------------

def layer_keys(prefix, attn_in, qkv_bias=False, o_bias=False, qk_norm=False):
    keys = {f"{prefix}self_attn.q_proj.weight": (Q, attn_in), f"{prefix}self_attn.k_proj.weight": (KV, attn_in),
            f"{prefix}self_attn.v_proj.weight": (KV, attn_in), f"{prefix}self_attn.o_proj.weight": (H, Q),
            f"{prefix}mlp.gate_proj.weight": (I, H), f"{prefix}mlp.up_proj.weight": (I, H),
            f"{prefix}mlp.down_proj.weight": (H, I), f"{prefix}post_attention_layernorm.weight": (H,)}
    if qkv_bias:
        keys.update({f"{prefix}self_attn.q_proj.bias": (Q,), f"{prefix}self_attn.k_proj.bias": (KV,),
                     f"{prefix}self_attn.v_proj.bias": (KV,)})
    if o_bias:
        keys[f"{prefix}self_attn.o_proj.bias"] = (H,)
    if qk_norm:
        keys.update({f"{prefix}self_attn.q_norm.weight": (D,), f"{prefix}self_attn.k_norm.weight": (D,)})
    return keys


def eagle3_keys(prefix, qk_norm=False):
    return {"fc.weight": (H, 3 * H), f"{prefix}hidden_norm.weight": (H,), f"{prefix}input_layernorm.weight": (H,),
            **layer_keys(prefix, 2 * H, qk_norm=qk_norm), "norm.weight": (H,), "lm_head.weight": (VD, H), "d2t": (VD,),
            "t2d": (V,)}


# what every engine's config says of a Llama draft layer for a non-Llama target: Llama, SiLU, no biases
LLAMA_LAYER = {
    "vllm": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu", "head_dim": D,
             "num_key_value_heads": 2, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    "sglang": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu", "head_dim": D,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
               "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    "speculators": {"speculators_model_type": "eagle3", "draft_vocab_size": VD,
                    "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
                    "transformer_layer_config": {"model_type": "llama", "hidden_act": "silu"}},
}
# (format, head, family) -> (weights file, {key: shape}, config fields that must hold these values)
EXPECTED = {
    ("vllm", "medusa-shared", "llama"): ("model.safetensors", {
        **{f"blocks.{h}.layers.0.{p}": (H, H) if p == "weight" else (H,) for h in range(3) for p in ("weight", "bias")},
        "lm_heads.0.weight": (V, H)},
        {"architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": 3, "num_hidden_layers": 1,
         "medusa_fc_bias": True, "original_lm_head": True, "hidden_size": H, "vocab_size": V,
         "truncated_vocab_size": V}),
    ("vllm", "medusa-own", "llama"): ("model.safetensors", {
        **{f"blocks.{h}.layers.{l}.{p}": (H, H) if p == "weight" else (H,) for h in range(2) for l in range(2)
           for p in ("weight", "bias")},
        **{f"lm_heads.{h}.weight": (V, H) for h in range(2)}},
        {"num_heads": 2, "num_hidden_layers": 2, "medusa_fc_bias": True, "original_lm_head": False}),
    ("vllm", "medusa-own-vocab", "llama"): ("model.safetensors", {
        **{f"blocks.{h}.layers.0.{p}": (H, H) if p == "weight" else (H,) for h in range(2) for p in ("weight", "bias")},
        **{f"lm_heads.{h}.weight": (VD, H) for h in range(2)}, "token_map": (VD,)},
        {"num_heads": 2, "original_lm_head": False, "vocab_size": V, "truncated_vocab_size": VD}),
    ("tgi", "medusa-shared", "llama"): ("medusa_lm_head.safetensors", {
        **{f"{h}.0.linear.{p}": (H, H) if p == "weight" else (H,) for h in range(3) for p in ("weight", "bias")}},
        {"medusa_num_heads": 3, "medusa_num_layers": 1}),
    ("tgi", "medusa-own", "llama"): ("medusa_lm_head.safetensors", {
        **{f"{h}.{l}.linear.{p}": (H, H) if p == "weight" else (H,) for h in range(2) for l in range(2)
           for p in ("weight", "bias")},
        **{f"{h}.2.weight": (V, H) for h in range(2)}},
        {"medusa_num_heads": 2, "medusa_num_layers": 2}),
    ("vllm", "eagle", "llama"): ("model.safetensors", {
        "fc.weight": (H, 2 * H), **layer_keys("layers.0.", H, qkv_bias=True, o_bias=True)},
        {"architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
         "attention_bias": True}),
    ("vllm", "eagle", "qwen2"): ("model.safetensors", {
        "fc.weight": (H, 2 * H), **layer_keys("layers.0.", H, qkv_bias=True, o_bias=True)},
        {"architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "attention_bias": True}),
    ("sglang", "eagle", "llama"): ("model.safetensors", {
        "fc.weight": (H, 2 * H), "fc.bias": (H,), **layer_keys("layers.0.", H)},
        {"architectures": ["LlamaForCausalLMEagle"], "model_type": "llama", "num_hidden_layers": 1}),
    ("sglang", "eagle", "qwen2"): ("model.safetensors", {
        "fc.weight": (H, 2 * H), "fc.bias": (H,), **layer_keys("layers.0.", H, qkv_bias=True)},
        {"architectures": ["Qwen2ForCausalLMEagle"], "model_type": "qwen2", "num_hidden_layers": 1}),
    ("vllm", "eagle3", "llama"): ("model.safetensors", eagle3_keys("midlayer."),
        {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
         "draft_vocab_size": VD, "target_hidden_size": H, "tie_word_embeddings": False, "norm_before_residual": False,
         "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}),  # 4-layer target: feature layers (0, 1, 2), vLLM ids + 1
    ("sglang", "eagle3", "llama"): ("model.safetensors", eagle3_keys("midlayer."),
        {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "draft_vocab_size": VD,
         "tie_word_embeddings": False, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
         "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}),
    ("speculators", "eagle3", "llama"): ("model.safetensors", eagle3_keys("layers.0."),
        {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": VD,
         "target_hidden_size": H, "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}),
    ("speculators", "eagle3-own", "qwen3"): ("model.safetensors", eagle3_keys("layers.0.", qk_norm=True),
        {"speculators_model_type": "eagle3", "draft_vocab_size": VD}),
    **{(fmt, "eagle3", family): ("model.safetensors", eagle3_keys("layers.0." if fmt == "speculators" else "midlayer."),
                                 LLAMA_LAYER[fmt])
       for fmt in LLAMA_LAYER for family in ("qwen2", "qwen3", "mistral", "gemma")
       if (fmt, family) != ("sglang", "gemma")},
}


def dflash_keys(layers: int, context_layers: int, vocab: bool = False) -> dict:
    keys = {"fc.weight": (H, context_layers * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for l in range(layers):
        keys.update(layer_keys(f"layers.{l}.", H, qk_norm=True))
        keys[f"layers.{l}.input_layernorm.weight"] = (H,)
    return {**keys, "lm_head.weight": (VD, H), "d2t": (VD,)} if vocab else keys


# 4-layer target: two draft layers read layers 1 and 2, one reads the middle layer 2 (z-lab's choice)
DFLASH_CONFIG = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu", "head_dim": D,
                 "tie_word_embeddings": False, "attention_bias": False}
EXPECTED.update({
    ("vllm", "dflash", "llama"): ("model.safetensors", dflash_keys(2, 2), {
        **DFLASH_CONFIG, "num_hidden_layers": 2, "block_size": 4, "layer_types": ["full_attention"] * 2,
        "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [1, 2], "block_size": 4,
                          "num_target_layers": 4}}),
    ("sglang", "dflash", "qwen3"): ("model.safetensors", dflash_keys(2, 2), {
        **DFLASH_CONFIG, "num_hidden_layers": 2, "block_size": 4,
        "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [1, 2], "block_size": 4,
                          "num_target_layers": 4}}),
    ("vllm", "dflash-vocab", "gemma"): ("model.safetensors", dflash_keys(1, 1, vocab=True), {
        **DFLASH_CONFIG, "num_hidden_layers": 1, "block_size": 8, "draft_vocab_size": VD,
        "dflash_config": {"mask_token_id": V - 1, "target_layer_ids": [2], "block_size": 8, "num_target_layers": 4}}),
    ("sglang", "dflash-vocab", "llama"): ("model.safetensors", dflash_keys(1, 1), {
        **DFLASH_CONFIG, "num_hidden_layers": 1, "block_size": 8}),
    # speculators: z-lab's tensors, its own config; ids one above z-lab's; the full-vocabulary head from the verifier
    ("speculators", "dflash", "qwen2"): ("model.safetensors", dflash_keys(2, 2), {
        "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "block_size": 4,
        "aux_hidden_state_layer_ids": [2, 3], "mask_token_id": V - 1, "draft_vocab_size": V,
        "sample_from_anchor": False, "transformer_layer_config": {"model_type": "qwen3", "num_hidden_layers": 2}}),
    ("speculators", "dflash-vocab", "llama"): ("model.safetensors", {**dflash_keys(1, 1, vocab=True), "t2d": (V,)}, {
        "speculators_model_type": "dflash", "block_size": 8, "aux_hidden_state_layer_ids": [3],
        "draft_vocab_size": VD, "transformer_layer_config": {"model_type": "qwen3", "num_hidden_layers": 1}}),
})
EXPECTED.update({
    ("vllm", "peagle", "qwen3"): ("model.safetensors", {**eagle3_keys("midlayer."), "mask_hidden": (1, 1, 3 * H)},
                                  {**LLAMA_LAYER["vllm"], "draft_vocab_size": VD, "pard_token": V - 1}),
    ("speculators", "peagle", "llama"): ("model.safetensors",
                                         {**eagle3_keys("layers.0."), "mask_hidden": (1, 1, 3 * H)},
                                         {"architectures": ["PEagleSpeculator"], "speculators_model_type": "peagle",
                                          "mask_token_id": V - 1, "draft_vocab_size": VD,
                                          "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}),
})
# DSpark in DeepSpec's layout (Qwen3DSparkModel): DFlash's tensors, the Markov (rank 8) and confidence heads; DeepSpec
# adds the target's embedding and whole lm_head, vLLM the draft vocabulary's rows and d2t where there is one
MARKOV = {"markov_head.markov_w1.weight": (V, 8), "confidence_head.proj.bias": (1,),
          "confidence_head.proj.weight": (1, H + 8)}
DSPARK_CONFIG = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "num_hidden_layers": 2, "block_size": 3,
                 "mask_token_id": V - 1, "target_layer_ids": [1, 2], "num_target_layers": 4, "num_anchors": 512,
                 "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
                 "confidence_head_with_markov": True, "tie_word_embeddings": False, "head_dim": D, "vocab_size": V,
                 "layer_types": ["full_attention"] * 2}
EXPECTED.update({
    ("deepspec", "dspark-full", "qwen3"): ("model.safetensors", {
        **dflash_keys(2, 2), **MARKOV, "markov_head.markov_w2.weight": (V, 8), "embed_tokens.weight": (V, H),
        "lm_head.weight": (V, H)}, DSPARK_CONFIG),
    ("vllm", "dspark-full", "llama"): ("model.safetensors", {
        **dflash_keys(2, 2), **MARKOV, "markov_head.markov_w2.weight": (V, 8)}, DSPARK_CONFIG),
    ("vllm", "dspark", "mistral"): ("model.safetensors", {
        **dflash_keys(2, 2, vocab=True), **MARKOV, "markov_head.markov_w2.weight": (VD, 8)},
        {**DSPARK_CONFIG, "draft_vocab_size": VD}),
})
DTYPES = {"d2t": torch.int64, "t2d": torch.bool, "token_map": torch.int64}


@pytest.mark.parametrize("fmt,head,family", list(EXPECTED), ids=["-".join(k) for k in EXPECTED])
def test_export_matches_what_the_loader_reads(fmt, head, family, natives, tmp_path):
    drafter, native = natives(family, head)
    # the default for a 4-layer target
    assert not head.startswith("eagle3") or drafter.config.feature_layers == [0, 1, 2]
    out = export_drafter(native, fmt, tmp_path / "out")
    weights_file, shapes, fields = EXPECTED[fmt, head, family]
    tensors = load_file(str(out / weights_file))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    for key, tensor in tensors.items():
        assert tensor.dtype == DTYPES.get(key, torch.float32), key
        assert torch.isfinite(tensor.float()).all(), key
    config = json.loads((out / "config.json").read_text())
    for field, value in fields.items():
        if isinstance(value, dict) and field == "transformer_layer_config":
            assert {k: config[field][k] for k in value} == value, field
        else:
            assert config[field] == value, field
    check_loader_traps(fmt, head, config)


def check_loader_traps(fmt, head, config):
    """The silent failures each loader has (see the LAYOUTS of interop/), checked on the written config."""
    if fmt == "tgi":
        assert "architectures" not in config  # any architecture but MLPSpeculator makes TGI skip the heads
        assert config["base_model_name_or_path"]
    if (fmt, head.split("-")[0]) == ("vllm", "medusa"):
        # vLLM's MedusaConfig renames every key with 'num'+'heads' / 'num'+'layers': only ours may exist
        assert ([k for k in config if "num" in k and ("heads" in k or "layers" in k)]
                == ["num_heads", "num_hidden_layers"])
    if head.startswith(("eagle", "peagle")) and fmt != "speculators":
        from transformers import AutoConfig

        parsed = AutoConfig.for_model(**config)  # the engines build a transformers config from it
        assert parsed.num_hidden_layers == 1 and parsed.hidden_size == H and parsed.head_dim == D
    if head.startswith("dspark") and fmt in ("vllm", "deepspec"):
        from transformers import AutoConfig

        parsed = AutoConfig.for_model(**config)  # DeepSpec's eval.py and vLLM read it as a Qwen3 config
        assert parsed.hidden_size == H and parsed.head_dim == D and parsed.rope_parameters["rope_theta"] > 0
        # vLLM reads these first, in other numberings; its speculators dialect would add a bonus slot
        assert not {"eagle_aux_hidden_state_layer_ids", "dflash_config", "dspark_bonus_anchor"} & set(config)
        assert ("draft_vocab_size" in config) == (head == "dspark")
    if head.startswith("dflash") and fmt != "speculators":
        from transformers import AutoConfig

        parsed = AutoConfig.for_model(**config)  # both engines read it as a Qwen3 config
        assert parsed.hidden_size == H and parsed.head_dim == D and parsed.rope_parameters["rope_theta"] > 0
        assert "eagle_aux_hidden_state_layer_ids" not in config  # vLLM would read it first, in its other numbering
        assert set(config["dflash_config"]) == {"mask_token_id", "target_layer_ids", "block_size", "num_target_layers"}
        assert ("draft_vocab_size" in config) == (fmt == "vllm" and head == "dflash-vocab")
    if fmt == "speculators":
        spec = config["speculators_config"]
        assert spec["proposal_methods"][0]["speculative_tokens"] >= 1
        assert spec["default_proposal_method"] == spec["proposal_methods"][0]["proposal_type"]
        assert (spec["verifier"]["name_or_path"]
                and config["transformer_layer_config"]["model_type"] in ("llama", "qwen3"))
        assert spec["algorithm"] == config["speculators_model_type"]
    if head == "peagle":  # the engines read the mask token under their own names; vLLM refuses to draft without it
        assert config["pard_token" if fmt == "vllm" else "mask_token_id"] == V - 1


# ---- engine semantics: recompute drafts from the exported tensors the way each engine does ------

def rms(x, weight, eps=1e-6):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_eagle_draft_vocabulary_is_left_out_of_engine_exports(fmt, targets, natives, tmp_path):
    """EAGLE-1/2 drafting among a draft vocabulary has no weights of its own for it (rows of the target's
    lm_head): the engine gets the same layer and drafts over the whole vocabulary."""
    target = targets["llama"]
    drafter, _ = natives("llama", "eagle")
    narrow = build_drafter("eagle", target, draft_vocab_size=50)
    narrow.load_state_dict({**drafter.state_dict(), "d2t": narrow.d2t, "t2d": narrow.t2d})
    folder = save_drafter(narrow, tmp_path / "narrow", target=target)
    loaded = load_drafter(export_drafter(folder, fmt, tmp_path / fmt), target)
    assert loaded.config.draft_vocab_size is None
    for key, value in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=1e-6, msg=key)


def test_vllm_medusa_forward_from_exported_tensors(targets, natives, tmp_path):
    """vLLM: per head x = x + SiLU(W x + b) per block, then lm_heads[h] (shared: lm_heads.0)."""
    target = targets["llama"]
    for head in ("medusa-shared", "medusa-own", "medusa-own-vocab"):
        drafter, native = natives("llama", head)
        t = load_file(str(export_drafter(native, "vllm", tmp_path / head) / "model.safetensors"))
        hidden = torch.randn(5, H)
        for h in range(drafter.config.num_heads):
            x = hidden
            for l in range(drafter.config.num_layers):
                x = x + F.silu(F.linear(x, t[f"blocks.{h}.layers.{l}.weight"], t[f"blocks.{h}.layers.{l}.bias"]))
            lm = t.get(f"lm_heads.{h}.weight", t["lm_heads.0.weight"])  # original_lm_head: one head for all
            logits = F.linear(x, lm)
            if "token_map" in t:  # truncated vocabulary: -inf everywhere but token_map's tokens
                logits = torch.full((5, V), float("-inf")).index_copy(-1, t["token_map"], logits)
            torch.testing.assert_close(logits, drafter.vocab.widen(drafter.head_logits(h, hidden).float()))
        if head == "medusa-shared":
            assert torch.equal(t["lm_heads.0.weight"], target.get_output_embeddings().weight)


def test_tgi_medusa_forward_from_exported_tensors(targets, natives, tmp_path):
    """TGI MedusaHeadV2: x + SiLU(linear_h(x)) through the target's own lm_head."""
    target = targets["llama"]
    drafter, native = natives("llama", "medusa-shared")
    t = load_file(str(export_drafter(native, "tgi", tmp_path / "tgi") / "medusa_lm_head.safetensors"))
    hidden = torch.randn(5, H)
    for h in range(3):
        y = hidden + F.silu(F.linear(hidden, t[f"{h}.0.linear.weight"], t[f"{h}.0.linear.bias"]))
        torch.testing.assert_close(target.get_output_embeddings()(y), drafter.head_logits(h, hidden))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_vllm_eagle_fold_is_exact(family, targets, natives, tmp_path):
    """vLLM's EAGLE-1 fc has no bias: the exported layer (attention biases, no fc bias) must give the
    layer output our drafter gives, built as vLLM builds it (a Llama layer from config.json)."""
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    target = targets[family]
    drafter, native = natives(family, "eagle")
    out = export_drafter(native, "vllm", tmp_path / "vllm")
    config = AutoConfig.for_model(**json.loads((out / "config.json").read_text()))
    tensors = load_file(str(out / "model.safetensors"))
    layer = LlamaDecoderLayer(config, 0)
    layer.input_layernorm = torch.nn.Identity()
    layer.load_state_dict({k.removeprefix("layers.0."): v for k, v in tensors.items() if k.startswith("layers.0.")})
    emb, feat = target.get_input_embeddings()(torch.tensor([[3, 9, 27, 81]])), torch.randn(1, 4, H)
    pos = torch.arange(4)[None]
    mask = torch.full((4, 4), float("-inf")).triu(1)[None, None]
    rope = target.model.rotary_emb(feat, pos)
    ours = drafter.layer(drafter.fc(torch.cat([emb, feat], -1)), attention_mask=mask, position_ids=pos,
                         position_embeddings=rope)
    engine = layer(F.linear(torch.cat([emb, feat], -1), tensors["fc.weight"]), attention_mask=mask, position_ids=pos,
                   position_embeddings=rope)
    torch.testing.assert_close(engine, ours, rtol=1e-5, atol=1e-5)


def eagle3_engine_logits(t: dict, target, ids: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """The engines' EAGLE-3 layer, causal over n positions, from exported tensors `t` (midlayer.* names): the
    embedding normed by input_layernorm, the hidden state by hidden_norm, attention over [emb; h] with the un-normed h
    as residual, then norm and lm_head. ids [1, n], carry [1, n, H] -> logits [1, n, Vd]."""
    n = ids.shape[1]
    emb = target.get_input_embeddings()(ids)
    cos, sin = target.model.rotary_emb(carry, torch.arange(n)[None])
    x = torch.cat([rms(emb, t["midlayer.input_layernorm.weight"]), rms(carry, t["midlayer.hidden_norm.weight"])], -1)
    q = F.linear(x, t["midlayer.self_attn.q_proj.weight"]).view(1, n, 4, D).transpose(1, 2)
    k = F.linear(x, t["midlayer.self_attn.k_proj.weight"]).view(1, n, 2, D).transpose(1, 2)
    v = F.linear(x, t["midlayer.self_attn.v_proj.weight"]).view(1, n, 2, D).transpose(1, 2)

    def rotate(y):
        half = y.shape[-1] // 2
        return y * cos[:, None] + torch.cat([-y[..., half:], y[..., :half]], -1) * sin[:, None]

    q, k = rotate(q), rotate(k)
    attn = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    h = carry + F.linear(attn.transpose(1, 2).reshape(1, n, Q), t["midlayer.self_attn.o_proj.weight"])
    m = rms(h, t["midlayer.post_attention_layernorm.weight"])
    mlp = F.linear(F.silu(F.linear(m, t["midlayer.mlp.gate_proj.weight"]))
                   * F.linear(m, t["midlayer.mlp.up_proj.weight"]), t["midlayer.mlp.down_proj.weight"])
    return F.linear(rms(h + mlp, t["norm.weight"]), t["lm_head.weight"])


def test_eagle3_norms_map_to_the_engine_roles(targets, natives, tmp_path):
    target = targets["llama"]
    drafter, native = natives("llama", "eagle3")
    t = load_file(str(export_drafter(native, "sglang", tmp_path / "sglang") / "model.safetensors"))
    n = 4
    ids, carry = torch.tensor([[3, 9, 27, 81]]), torch.randn(1, n, H)
    logits = eagle3_engine_logits(t, target, ids, carry)
    from draftheads.heads.parts.layers import causal_visible

    with torch.no_grad():
        out = drafter.forward_layer(carry, ids, torch.arange(n)[None], causal_visible(None, 1, n))
        ours = drafter.draft_logits(out)
    torch.testing.assert_close(logits, ours, rtol=1e-4, atol=1e-4)
    # d2t holds offsets: draft id i is target token i + d2t[i], and t2d marks exactly those tokens
    assert torch.equal((torch.arange(VD) + t["d2t"]).sort().values, t["t2d"].nonzero().flatten())


def test_peagle_mask_slots_from_exported_tensors(targets, natives, tmp_path):
    """vLLM's parallel drafting from our export: the committed positions (fc of their fused features, their next
    tokens) and then depths - 1 slots of pard_token with fc(mask_hidden), consecutive positions, one causal forward;
    the last committed position and the slots give the logits of depths 1..K, as our drafter's one pass does."""
    target = targets["llama"]
    drafter, native = natives("llama", "peagle")
    folder = export_drafter(native, "vllm", tmp_path / "vllm")
    t, config = load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())
    features, next_tokens = features_for(drafter, target, PROMPT)
    slots = drafter.config.depths - 1
    mask_carry = F.linear(t["mask_hidden"].view(1, -1), t["fc.weight"]).expand(1, slots, -1)
    carry = torch.cat([F.linear(features[..., : 3 * H], t["fc.weight"]), mask_carry], 1)
    ids = torch.cat([next_tokens, torch.full((1, slots), config["pard_token"])], 1)
    with torch.no_grad():
        engine = eagle3_engine_logits(t, target, ids, carry)[:, PROMPT.shape[1] - 1 :]
        drafter.reset()
        drafter.observe(features, next_tokens)
        state = drafter._drafting
        ours = torch.cat([drafter.draft_logits(state.root_out)[:, None],
                          drafter.draft_logits(state.slot_outputs(drafter, slots))], 1)
    torch.testing.assert_close(engine, ours, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_dflash_block_from_exported_tensors(fmt, targets, natives, tmp_path):
    """The engines' DFlash forward: context = hidden_norm(fc(features)); per layer the block's queries (q_norm, RoPE)
    attend, with no mask, to k/v of the un-normed context and of input_layernorm(block) (k_norm, RoPE at absolute
    positions); residual, SwiGLU; norm; the target's lm_head (vLLM with a draft vocabulary: its rows, d2t)."""
    family = "qwen3"
    target = targets[family]
    drafter, native = natives(family, "dflash")
    t = load_file(str(export_drafter(native, fmt, tmp_path / fmt) / "model.safetensors"))
    config = json.loads((tmp_path / fmt / "config.json").read_text())
    block, layers = config["block_size"], config["num_hidden_layers"]
    ids = PROMPT[:, :6]
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i + 1] for i in config["dflash_config"]["target_layer_ids"]], -1)
    context = rms(F.linear(features, t["fc.weight"]), t["hidden_norm.weight"])
    pending = torch.tensor([[7]])
    tokens = torch.cat([pending, torch.full((1, block - 1), config["dflash_config"]["mask_token_id"])], 1)
    x = target.get_input_embeddings()(tokens)
    n, c = block, ids.shape[1]
    cos, sin = target.model.rotary_emb(x, torch.arange(c + n)[None])

    def rotate(y, at):
        half = y.shape[-1] // 2
        return y * cos[:, None, at] + torch.cat([-y[..., half:], y[..., :half]], -1) * sin[:, None, at]

    def heads(y, count, weight, norm=None):
        y = F.linear(y, weight).view(1, y.shape[1], count, D)
        return (rms(y, norm) if norm is not None else y).transpose(1, 2)

    for l in range(layers):
        p = f"layers.{l}."
        normed = rms(x, t[p + "input_layernorm.weight"])
        q = rotate(heads(normed, 4, t[p + "self_attn.q_proj.weight"], t[p + "self_attn.q_norm.weight"]), slice(c, None))
        kv_in = torch.cat([context, normed], 1)
        k = rotate(heads(kv_in, 2, t[p + "self_attn.k_proj.weight"], t[p + "self_attn.k_norm.weight"]), slice(None))
        v = heads(kv_in, 2, t[p + "self_attn.v_proj.weight"])
        attn = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
        x = x + F.linear(attn.transpose(1, 2).reshape(1, n, Q), t[p + "self_attn.o_proj.weight"])
        m = rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + F.linear(F.silu(F.linear(m, t[p + "mlp.gate_proj.weight"])) * F.linear(m, t[p + "mlp.up_proj.weight"]),
                         t[p + "mlp.down_proj.weight"])
    logits = target.get_output_embeddings()(rms(x, t["norm.weight"]))[:, 1:]
    drafter.reset()
    drafter.observe(features, torch.cat([ids[:, 1:], pending], 1))
    state = drafter._drafting
    with torch.no_grad():
        ours = drafter.vocab_logits(drafter.run_block(state.root_token, state.committed, state.context))
    torch.testing.assert_close(logits, ours, rtol=1e-4, atol=1e-4)


def test_dflash_draft_vocabulary_stays_with_vllm(targets, natives, tmp_path):
    """vLLM gets the draft vocabulary's lm_head rows and d2t and drafts what we draft; SGLang, whose DFlash has no
    lm_head of its own, gets the same layers and drafts over the whole vocabulary."""
    target = targets["llama"]
    drafter, native = natives("llama", "dflash-vocab")
    vllm_folder = export_drafter(native, "vllm", tmp_path / "vllm")
    t = load_file(str(vllm_folder / "model.safetensors"))
    rows = target.get_output_embeddings().weight[torch.arange(VD) + t["d2t"]]
    assert torch.equal(t["lm_head.weight"], rows)
    assert load_drafter(vllm_folder, target).config == drafter.config
    loaded = load_drafter(export_drafter(native, "sglang", tmp_path / "sglang"), target)
    assert loaded.config.draft_vocab_size is None
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, drafter.state_dict()[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("fmt,head", [("deepspec", "dspark-full"), ("vllm", "dspark"), ("vllm", "dspark-full")])
def test_dspark_slots_and_confidence_from_exported_tensors(fmt, head, targets, natives, tmp_path):
    """DeepSpec's and vLLM's DSpark slot: lm_head(h_k) + W2 · W1[previous token] (vLLM with a draft vocabulary: the
    lm_head rows and W2 rows of the draft ids, d2t mapping them to target ids), and the confidence
    sigmoid(proj([h_k; W1[previous token]])), from the exported tensors alone; the block outputs h are DFlash's layers,
    which test_dflash_block_from_exported_tensors recomputes."""
    target = targets["llama"]
    drafter, native = natives("llama", head)
    folder = export_drafter(native, fmt, tmp_path / fmt)
    t = load_file(str(folder / "model.safetensors"))
    hidden = torch.randn(1, 3, H)
    prev = torch.tensor([[7, 250, 31]])   # the anchor, then the tokens drawn at slots 0 and 1
    markov = F.embedding(prev, t["markov_head.markov_w1.weight"])
    engine = F.linear(hidden, t.get("lm_head.weight", target.get_output_embeddings().weight))
    engine = engine + F.linear(markov, t["markov_head.markov_w2.weight"])
    confidence = torch.sigmoid(F.linear(torch.cat([hidden, markov], -1), t["confidence_head.proj.weight"],
                                        t["confidence_head.proj.bias"]))
    with torch.no_grad():
        ours = drafter.slot_logits(hidden, prev)
        ours_confidence = torch.sigmoid(drafter.confidence_logits(hidden, prev))
    if "d2t" in t:   # column i is target token i + d2t[i], the draft vocabulary's order
        assert torch.equal(drafter.vocab.ids, torch.arange(VD) + t["d2t"])
    torch.testing.assert_close(engine, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(confidence, ours_confidence.reshape(confidence.shape), rtol=1e-5, atol=1e-5)
    if fmt == "deepspec":   # its own frozen copies of the target's tables
        assert torch.equal(t["embed_tokens.weight"], target.get_input_embeddings().weight)
        assert torch.equal(t["lm_head.weight"], target.get_output_embeddings().weight)


def test_deepspec_refuses_a_draft_vocabulary_and_names_vllm(natives, tmp_path):
    _, native = natives("qwen3", "dspark")
    with pytest.raises(DraftheadsError, match="whole vocabulary.*export it as 'vllm'"):
        export_drafter(native, "deepspec", tmp_path / "deepspec")


@pytest.mark.parametrize("fmt", ["deepspec", "speculators"])
@pytest.mark.parametrize("setting,reason", [({"dspark_bonus_anchor": True}, "bonus anchor slot"),
                                            ({"sample_from_anchor": False}, "from the mask slots only"),
                                            ({"markov_head_type": "second_order"}, "Markov head is 'second_order'")])
def test_an_engine_dspark_folder_that_drafts_otherwise_is_refused_on_load(fmt, setting, reason, targets, natives,
                                                                          tmp_path):
    _, native = natives("qwen3", "dspark-full")
    folder = export_drafter(native, fmt, tmp_path / fmt)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **setting}))
    with pytest.raises(DraftheadsError, match=reason) as err:
        load_drafter(folder, targets["qwen3"])
    assert "\n" not in str(err.value)


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("family", FAMILIES)
def test_refused_combinations_name_the_allowed_formats(family, head, natives, tmp_path):
    _, native = natives(family, head)
    allowed = ALLOWED[head][family]
    for fmt in ENGINE_FORMATS:
        if fmt in allowed:
            continue
        with pytest.raises(DraftheadsError) as err:
            export_drafter(native, fmt, tmp_path / fmt)
        message = str(err.value)
        assert "\n" not in message and f"'{fmt}'" in message
        assert message.endswith("formats for it: " + ", ".join(("native",) + allowed))
        assert not (tmp_path / fmt).exists()


def test_tgi_refuses_shared_lm_head_with_several_blocks(targets, tmp_path):
    drafter = build_drafter("medusa", targets["llama"], num_heads=2, num_layers=2)
    native = save_drafter(drafter, tmp_path / "native", target=targets["llama"])
    with pytest.raises(DraftheadsError, match="one block per head.*formats for it: native, vllm$"):
        export_drafter(native, "tgi", tmp_path / "tgi")


def edited_native(native, folder, head):
    """A copy of a native folder whose config.json carries a different head section."""
    folder.mkdir()
    config = json.loads((native / "config.json").read_text())
    config["head"] = head
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((native / "model.safetensors").read_bytes())
    return folder


def test_medusa2_is_refused(natives, tmp_path):
    drafter, native = natives("llama", "medusa-shared")
    medusa2 = edited_native(native, tmp_path / "medusa2", to_dict(drafter.config) | {"medusa2": True})
    with pytest.raises(DraftheadsError, match="Medusa-2.*formats for it: native$"):
        export_drafter(medusa2, "vllm", tmp_path / "a")


def test_a_peagle_with_a_markov_head_exports_only_natively(targets, tmp_path):
    """No engine adds a Markov bias to P-EAGLE's slots: without it they would draft otherwise than trained."""
    target = targets["llama"]
    drafter = build_drafter("peagle", target, draft_vocab_size=VD, depths=3, markov_rank=8)
    native = save_drafter(drafter, tmp_path / "native", target=target)
    for fmt in ("vllm", "speculators"):
        with pytest.raises(DraftheadsError, match="Markov head on P-EAGLE.*formats for it: native$"):
            export_drafter(native, fmt, tmp_path / fmt)
    back = load_drafter(native, target)
    assert back.config.markov_rank == 8
    torch.testing.assert_close(back.markov_head.markov_w1.weight, drafter.markov_head.markov_w1.weight)


@pytest.mark.parametrize("rank", [8, 0])
def test_dspark_on_a_target_that_transforms_its_logits_exports_only_natively(rank, tokenizer, tmp_path):
    """Every engine's DSpark adds the Markov bias to lm_head's raw logits; ours to the target's (here Granite's
    logits / logits_scaling), so the argmax of a slot differs. Without a Markov head the argmax is the same."""
    from draftheads.interop.export import FORMATS, find_layout, refusal
    from draftheads.interop.native import SavedDrafter
    from tests.families import family_target

    target = family_target("granite", tokenizer)
    target.save_pretrained(tmp_path / "target")
    target.config._name_or_path = str(tmp_path / "target")
    drafter = build_drafter("dspark", target, block_size=3, num_layers=1, markov_rank=rank,
                           confidence_with_markov=bool(rank))
    native = save_drafter(drafter, tmp_path / "native", target=target)
    saved = SavedDrafter.read(native)
    engines = [fmt for fmt in FORMATS if fmt != "native" and find_layout(fmt, "dspark")]
    assert len(engines) == 4, engines   # DeepSpec, vLLM, speculators, llama.cpp
    for fmt in engines:
        reason = refusal(saved, fmt) or ""
        assert "this  " not in reason, reason
        assert ("logits_scaling 4.0" in reason) == bool(rank), (fmt, reason)
    if rank:
        line = r"speculators 0.9.0 \(DSparkDraftModel\) adds DSpark's Markov bias.*this granite target.*for it: native$"
        with pytest.raises(DraftheadsError, match=line):
            export_drafter(native, "speculators", tmp_path / "speculators")


def tiny_deepseek_v3(vocab):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "deepseek_v3", vocab_size=vocab, hidden_size=H, intermediate_size=I, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        n_group=1, topk_group=1, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_mtp_to_deepseek_layout_is_refused_with_the_reason(family, targets, tmp_path):
    """Llama-family: vLLM's DeepSeek MTP builds a DeepSeek-V2 block. DeepSeek-V3: that block is MoE,
    ours is a copy of the target's dense layer 0 (first_k_dense_replace > 0)."""
    target = targets[family] if family in targets else tiny_deepseek_v3(V)
    native = save_drafter(build_drafter("mtp", target, depth=2), tmp_path / "native", target=target)
    reason = "no mtp layer for a llama target.*deepseek_v3" if family == "llama" else "dense-MLP layer.*MoE"
    with pytest.raises(DraftheadsError, match=f"'deepseek-mtp': .*{reason}.*formats for it: native$"):
        export_drafter(native, "deepseek-mtp", tmp_path / "out")
    for fmt in ("vllm", "sglang", "tgi", "speculators", "llama.cpp"):
        with pytest.raises(DraftheadsError, match="has no loader for MTP drafters \\(it loads .* drafters only\\)"):
            export_drafter(native, fmt, tmp_path / fmt)


def test_unknown_format_and_foreign_folder_are_one_line_errors(natives, targets, tmp_path):
    _, native = natives("llama", "eagle")
    with pytest.raises(DraftheadsError, match="unknown export format 'vlm'.*did you mean 'vllm'"):
        export_drafter(native, "vlm", tmp_path / "x")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(DraftheadsError, match="neither a draftheads drafter nor a layout"):
        load_drafter(tmp_path / "junk", targets["llama"])


def test_load_drafter_given_load_targets_tuple_says_which_item(natives, targets):
    _, native = natives("llama", "eagle3")
    with pytest.raises(DraftheadsError, match=r"given a tuple: pass load_target\(\.\.\.\)\[0\]"):
        load_drafter(native, (targets["llama"], None))


def test_native_export_validates_and_copies(natives, tmp_path):
    drafter, native = natives("llama", "eagle")
    out = export_drafter(native, "native", tmp_path / "copy")
    assert sorted(p.name for p in out.iterdir()) == sorted([p.name for p in native.iterdir()]
                                                           + ["draftheads_export.json", "README.md"])
    # eagle tensors, medusa config
    broken = edited_native(native, tmp_path / "broken", {"type": "medusa", "num_heads": 2})
    with pytest.raises(DraftheadsError, match="does not match its config.json"):
        export_drafter(broken, "native", tmp_path / "bad")


# a head each format loads, from the fixtures above (no tiny target makes a drafter deepseek-mtp takes)
FITS = {"native": "medusa-shared", "vllm": "eagle3", "sglang": "eagle", "tgi": "medusa-own", "speculators": "eagle3",
        "llama.cpp": "eagle3"}


@pytest.fixture(scope="module")
def narrow(tmp_path_factory, tokenizer):
    """(model, folder): a Llama target of hidden size 32, which no drafter of `natives` (hidden 64) fits."""
    folder = tmp_path_factory.mktemp("target-narrow")
    model = make_target("llama", tokenizer, hidden_size=32, intermediate_size=64)
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("fmt", list(FITS))
def test_a_drafter_that_does_not_fit_the_target_is_refused_as_eval_refuses_it(fmt, natives, narrow, tmp_path):
    """Export makes the check loading makes (issue 52: it wrote tensors no engine could load, with exit 0)."""
    model, folder = narrow
    _, native = natives("llama", FITS[fmt])
    with pytest.raises(DraftheadsError, match="hidden_size 64 but this target has hidden_size 32; export it with "
                                              "--target"):
        export_drafter(native, fmt, tmp_path / "recorded", target=str(folder))
    # a config.json that records this target's sizes, over weights made for hidden 64: the shapes themselves refuse
    lying = tmp_path / "lying"
    lying.mkdir()
    config = json.loads((native / "config.json").read_text())
    config["target"]["hidden_size"] = 32
    (lying / "config.json").write_text(json.dumps(config))
    (lying / "model.safetensors").write_bytes((native / "model.safetensors").read_bytes())
    with pytest.raises(DraftheadsError, match="does not fit the target .* where this target needs \\[.*32") as info:
        export_drafter(lying, fmt, tmp_path / "shapes", target=str(folder))
    assert "\n" not in str(info.value)
    with pytest.raises(DraftheadsError):
        load_drafter(lying, model)  # what eval does with the same folder
    assert not (tmp_path / "recorded").exists() and not (tmp_path / "shapes").exists()


# ---- public reference layouts ------------------------------------------------------------------

def test_medusa_v01_reference_layout_loads(targets, tmp_path):
    """Medusa v0.1: medusa_lm_head.pt with {i}.0.linear.* and each head's own lm head {i}.1.weight."""
    target = targets["llama"]
    torch.manual_seed(5)
    tensors = {}
    for i in range(2):
        tensors.update({f"{i}.0.linear.weight": torch.randn(H, H) * 0.1, f"{i}.0.linear.bias": torch.randn(H) * 0.1,
                        f"{i}.1.weight": torch.randn(V, H)})
    torch.save(tensors, tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1, "hidden_size": H,
                                                      "vocab_size": V, "base_model_name_or_path": "x"}))
    drafter = load_drafter(tmp_path, target)
    hidden = torch.randn(3, H)
    for i in range(2):
        y = hidden + F.silu(F.linear(hidden, tensors[f"{i}.0.linear.weight"], tensors[f"{i}.0.linear.bias"]))
        torch.testing.assert_close(drafter.head_logits(i, hidden), F.linear(y, tensors[f"{i}.1.weight"]))
    assert drafter.config.lm_head == "own" and drafter.config.num_heads == 2


def test_eagle_reference_layout_loads(targets, natives, tmp_path):
    """EAGLE (SafeAILab): a Llama config.json beside pytorch_model.bin with fc.* and layers.0.* (+ embeddings)."""
    target = targets["llama"]
    drafter, native = natives("llama", "eagle")
    state = {("layers.0." + k.removeprefix("layer.")) if k.startswith("layer.") else k: v
             for k, v in drafter.state_dict().items()}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    config = target.config.to_dict() | {"num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_drafter(tmp_path, target)
    for key, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_import_refuses_a_checkpoint_for_another_target(targets, natives, tmp_path):
    _, native = natives("llama", "eagle")
    out = export_drafter(native, "sglang", tmp_path / "sglang")
    with pytest.raises(DraftheadsError, match="(shape|unexpected|missing)"):
        load_drafter(out, targets["qwen3"])  # qwen3 layer has q_norm/k_norm that the file lacks


@pytest.mark.parametrize("change", [{"norm_before_residual": True}, {"norm_before_fc": True}, {"norm_output": True},
                                    {"fc_norm": True}, "input_norm.weight"])
def test_an_eagle3_folder_with_speculators_other_norms_is_refused(change, natives, targets, tmp_path):
    """speculators' trainer turns three norms on by default: read as our layer, such a folder would draft wrongly."""
    _, native = natives("llama", "eagle3")
    out = export_drafter(native, "speculators", tmp_path / "speculators")
    if isinstance(change, dict):
        config = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(config | change))
        named = next(iter(change))
    else:
        tensors = load_file(out / "model.safetensors")
        save_file({**tensors, change: torch.ones(3 * H)}, out / "model.safetensors")
        named = change
    with pytest.raises(DraftheadsError, match=f"normalises where ours does not \\({named}\\).*--no-norm-before"):
        load_drafter(out, targets["llama"])


# ---- the speculators package itself ------------------------------------------------------------

SPECULATORS_CASES = [(family, head) for family, head, fmt in CASES if fmt == "speculators"]
SPECULATORS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-speculators" / "bin" / "python"


def test_the_speculators_package_loads_every_export(natives, tmp_path):
    """speculators' own loader (Eagle3DraftModel / PEagleDraftModel / DFlashDraftModel.from_pretrained, in the second
    virtual environment `make` builds: speculators pins its own transformers and torch) loads our EAGLE-3, P-EAGLE and
    DFlash exports for every family and draft layer: every parameter finite (it fills what it does not find with NaN)
    and equal to ours."""
    if not SPECULATORS_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{SPECULATORS_PYTHON} is missing: CI runs `make test`, which builds it (make "
                        "speculators-venv)")
        pytest.skip("no .venv-speculators: run `make speculators-venv` (or `make test`) to check against "
                    "speculators' loader")
    folders = []
    for family, head in SPECULATORS_CASES:
        _, native = natives(family, head)
        folders.append(str(export_drafter(native, "speculators", tmp_path / f"{family}-{head}")))
    script = Path(__file__).resolve().parents[1] / "engines" / "speculators_check.py"
    done = subprocess.run([str(SPECULATORS_PYTHON), str(script), *folders], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["folder"] for r in results] == folders
    failed = {r["folder"]: r["problems"] for r in results if not r["ok"]}
    assert not failed, failed


def test_vllm_medusa_token_map_over_full_vocabulary_heads_loads_as_a_draft_vocabulary(targets, natives, tmp_path):
    """vLLM keeps token_map's rows of full-vocabulary lm heads; a folder written that way loads as ours."""
    from safetensors.torch import save_file

    target = targets["llama"]
    drafter, native = natives("llama", "medusa-own-vocab")
    folder = export_drafter(native, "vllm", tmp_path / "vllm")
    t = load_file(str(folder / "model.safetensors"))
    for h in range(2):
        t[f"lm_heads.{h}.weight"] = torch.randn(V, H).index_copy(0, t["token_map"], t[f"lm_heads.{h}.weight"])
    save_file(t, str(folder / "model.safetensors"))
    (folder / "draftheads_export.json").unlink()
    loaded = load_drafter(folder, target)
    assert loaded.config.draft_vocab_size == VD and loaded.config.lm_head == "own"
    for key, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    config = json.loads((folder / "config.json").read_text())
    save_file({k: v for k, v in t.items() if k != "token_map"}, str(folder / "model.safetensors"))
    with pytest.raises(DraftheadsError, match="truncated_vocab_size 100 < 384 but has no token_map"):
        load_drafter(folder, target)
    assert config["truncated_vocab_size"] == VD


# ---- draft layer, rope scaling, dtype, draft length ------------------------------------------------

def test_a_llama_layer_drafter_for_a_qwen3_target_is_what_the_public_checkpoints_are(targets, natives, tmp_path):
    """SGLang's export of a Llama-layer drafter for Qwen3 is the shape of SpecForge's Qwen3 drafters: without our
    provenance file it loads (as a drafter, or as head.init_from) with a Llama layer (no q/k norms)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    drafter, native = natives("qwen3", "eagle3")
    assert type(drafter.layer) is LlamaDecoderLayer
    folder = export_drafter(native, "sglang", tmp_path / "sglang")
    (folder / "draftheads_export.json").unlink()   # as a folder someone else wrote
    loaded = load_drafter(folder, targets["qwen3"])
    assert loaded.config.draft_layer == "llama" and type(loaded.layer) is LlamaDecoderLayer
    for key, value in drafter.state_dict().items():   # head.init_from loads a folder the same way
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_native_folder_saved_before_draft_layer_existed_keeps_the_targets_class(targets, natives, tmp_path):
    drafter, native = natives("qwen3", "eagle3-own")
    head = to_dict(drafter.config)
    del head["draft_layer"]
    old = edited_native(native, tmp_path / "old", head)
    loaded = load_drafter(old, targets["qwen3"])
    assert loaded.config.draft_layer == "target" and hasattr(loaded.layer.self_attn, "q_norm")
    assert json.loads((export_drafter(old, "speculators", tmp_path / "spec") / "config.json").read_text())[
        "transformer_layer_config"]["model_type"] == "qwen3"


def test_draft_layer_applies_to_eagle3_only(targets):
    with pytest.raises(DraftheadsError, match="unknown key .draft_layer."):
        build_drafter("eagle", targets["llama"], draft_layer="llama")


LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 128}


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_llama31_rope_scaling_reaches_every_engine(fmt, tokenizer, natives, tmp_path):
    """SGLang (transformers 4.55) and older vLLM read rope_scaling, not rope_parameters: a Llama-3.1 drafter without
    it would run there with plain RoPE, silently."""
    target = make_target("llama", tokenizer, rope_parameters=dict(LLAMA31_ROPE))
    target.save_pretrained(tmp_path / "target")
    target.config._name_or_path = str(tmp_path / "target")
    native = save_drafter(build_drafter("eagle3", target, draft_vocab_size=VD), tmp_path / "native", target=target)
    config = json.loads((export_drafter(native, fmt, tmp_path / fmt) / "config.json").read_text())
    layer = config["transformer_layer_config"] if fmt == "speculators" else config
    scaling = {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_theta"}
    assert layer["rope_scaling"] == scaling and layer["rope_theta"] == 500000.0
    assert layer["rope_parameters"]["rope_type"] == "llama3"
    _, default = natives("llama", "eagle3")          # plain RoPE: rope_scaling null, as transformers 4 wrote it
    config = json.loads((export_drafter(default, fmt, tmp_path / "default") / "config.json").read_text())
    assert (config["transformer_layer_config"] if fmt == "speculators" else config)["rope_scaling"] is None


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_export_dtype_casts_the_weights_and_says_so(dtype, torch_dtype, targets, natives, tmp_path):
    drafter, native = natives("qwen3", "eagle3")
    out = export_drafter(native, "vllm", tmp_path / "vllm", dtype=dtype)
    tensors = load_file(str(out / "model.safetensors"))
    for key, tensor in tensors.items():
        assert tensor.dtype == DTYPES.get(key, torch_dtype), key
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == str(torch_dtype).removeprefix("torch.")
    loaded = load_drafter(out, targets["qwen3"]).state_dict()
    for key, value in drafter.state_dict().items():
        if value.is_floating_point():
            assert torch.equal(loaded[key], value.to(torch_dtype).float()), key
    native_out = export_drafter(native, "native", tmp_path / "native", dtype=dtype)
    assert ({t.dtype for t in load_file(str(native_out / "model.safetensors")).values() if t.is_floating_point()}
            == {torch_dtype})
    with pytest.raises(DraftheadsError, match="unknown export dtype 'int8'; use one of bf16, fp16, fp32"):
        export_drafter(native, "vllm", tmp_path / "bad", dtype="int8")


def test_speculative_tokens_are_the_trained_length_unless_given(targets, tmp_path):
    target = targets["llama"]
    drafter = build_drafter("eagle3", target, draft_vocab_size=VD, ttt_steps=3, default_tree="dynamic:8,6,48")
    native = save_drafter(drafter, tmp_path / "native", target=target)

    def tokens(out, **kw):
        config = json.loads((export_drafter(native, "speculators", tmp_path / out, **kw) / "config.json").read_text())
        return config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]

    assert tokens("a") == 3                          # the training-time-test unroll, not the wide tree's depth 6
    assert tokens("b", speculative_tokens=5) == 5
    with pytest.raises(DraftheadsError, match="--speculative-tokens must be a whole number >= 1"):
        tokens("c", speculative_tokens=0)
