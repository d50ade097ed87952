"""Tensor-name maps between our native drafters and the engine layouts of engine_formats.py,
both directions, plus the one exact re-parametrisation vLLM's EAGLE-1 layout needs.

Native names (heads/medusa.py, heads/eagle.py):
  Medusa  heads.{h}.{l}.linear.{weight,bias}, lm_heads.{h}.weight ('own' lm heads)
  EAGLE   fc.{weight,bias}, layer.* (input_layernorm is the identity, so absent)
  EAGLE-3 fc.weight, layer.* (layer.input_layernorm normalises h), embed_norm (normalises the
          embedding), norm, lm_head, d2t, t2d
"""

from __future__ import annotations

import re

import torch

from draftheads.errors import DraftheadsError

ATTN = ("q_proj", "k_proj", "v_proj")


# ---- Medusa ----------------------------------------------------------------------------------

def medusa_to_vllm(state: dict, num_heads: int, num_layers: int) -> dict:
    """blocks.{h}.layers.{l}.* (+ lm_heads.{h}.weight when the heads own their lm heads)."""
    out = {}
    for h in range(num_heads):
        for l in range(num_layers):
            for part in ("weight", "bias"):
                out[f"blocks.{h}.layers.{l}.{part}"] = state[f"heads.{h}.{l}.linear.{part}"]
        if f"lm_heads.{h}.weight" in state:
            out[f"lm_heads.{h}.weight"] = state[f"lm_heads.{h}.weight"]
    return out


def medusa_from_vllm(tensors: dict, num_heads: int, num_layers: int) -> dict:
    state = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("medusa_heads.")
        if m := re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", name):
            state[f"heads.{m[1]}.{m[2]}.linear.{m[3]}"] = tensor
        elif re.fullmatch(r"lm_heads\.\d+\.weight", name):
            state[name] = tensor
    return state


def medusa_to_tgi(state: dict, num_heads: int, num_layers: int) -> dict:
    """Medusa v0.1 / TGI names: {h}.{l}.linear.* then {h}.{L}.weight for an own lm head."""
    out = {}
    for h in range(num_heads):
        for l in range(num_layers):
            for part in ("weight", "bias"):
                out[f"{h}.{l}.linear.{part}"] = state[f"heads.{h}.{l}.linear.{part}"]
        if f"lm_heads.{h}.weight" in state:
            out[f"{h}.{num_layers}.weight"] = state[f"lm_heads.{h}.weight"]
    return out


def medusa_from_tgi(tensors: dict, num_layers: int) -> dict:
    state = {}
    for name, tensor in tensors.items():
        if m := re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", name):
            state[f"heads.{m[1]}.{m[2]}.linear.{m[3]}"] = tensor
        elif (m := re.fullmatch(r"(\d+)\.(\d+)\.weight", name)) and int(m[2]) == num_layers:
            state[f"lm_heads.{m[1]}.weight"] = tensor
    return state


# ---- EAGLE-1/2 -------------------------------------------------------------------------------

def eagle_to_engine(state: dict, fold_fc_bias: bool) -> dict:
    """fc + layers.0.*; with `fold_fc_bias` the fc bias moves into the attention biases (vLLM).

    A draft vocabulary (d2t/t2d) is left out: EAGLE-1 engines draft with the target's whole lm_head,
    whose rows the draft vocabulary only selects, so the exported layer drafts a superset."""
    out = {name.replace("layer.", "layers.0.", 1) if name.startswith("layer.") else name: t for name, t in state.items()
           if name not in ("d2t", "t2d")}
    if fold_fc_bias:
        fold_fc_bias_into_attention(out)
    return out


def fold_fc_bias_into_attention(tensors: dict) -> None:
    """Rewrite fc(x) = W x + b as W x, exactly, for a layer without an input norm.

    The layer computes r = x + o_proj(attn(q_proj x, k_proj x, v_proj x)), so with x = W z + b:
    p_proj x = p_proj(W z) + P b for p in q/k/v (add P b to their biases), and the residual's b is
    o_proj's output plus b (add b to o_proj's bias). Everything after r is unchanged.
    """
    b = tensors.pop("fc.bias").double()
    for proj in ATTN:
        weight = tensors[f"layers.0.self_attn.{proj}.weight"]
        key = f"layers.0.self_attn.{proj}.bias"
        base = tensors[key].double() if key in tensors else torch.zeros(weight.shape[0], dtype=torch.float64)
        tensors[key] = (base + weight.double() @ b).to(weight.dtype)
    key = "layers.0.self_attn.o_proj.bias"
    base = tensors[key].double() if key in tensors else torch.zeros_like(b)
    tensors[key] = (base + b).to(tensors["fc.weight"].dtype)


def eagle_from_engine(tensors: dict, own_keys: set[str]) -> dict:
    """Engine EAGLE-1 tensors -> native names, undoing a folded fc bias when the file has one.

    `own_keys` are the drafter's state-dict keys: a bias the target's layer does not have must
    come from the fold (or be zero), otherwise the checkpoint cannot be represented.
    """
    state = {}
    for name, tensor in tensors.items():
        if name.startswith("layers.0."):
            state["layer." + name.removeprefix("layers.0.")] = tensor
        elif name.startswith("fc."):
            state[name] = tensor
    if "fc.bias" not in state and "fc.bias" in own_keys:
        unfold_fc_bias(state, own_keys)
    return state


def unfold_fc_bias(state: dict, own_keys: set[str]) -> None:
    """Inverse of the fold: fc.bias = o_proj's bias (the target layer has none); q/k/v keep the rest."""
    weight = state["fc.weight"]
    o_key = "layer.self_attn.o_proj.bias"
    b = state.pop(o_key).double() if o_key in state and o_key not in own_keys else torch.zeros(weight.shape[0], dtype=torch.float64)
    state["fc.bias"] = b.to(weight.dtype)
    for proj in ATTN:
        key = f"layer.self_attn.{proj}.bias"
        if key not in state:
            continue
        rest = state[key].double() - state[f"layer.self_attn.{proj}.weight"].double() @ b
        if key in own_keys:
            state[key] = rest.to(weight.dtype)
        elif rest.abs().max() <= 1e-4 * (1 + state[key].double().abs().max()):
            del state[key]
        else:
            raise DraftheadsError(
                f"this EAGLE checkpoint has a {proj} bias the target's decoder layer cannot hold; it was trained for another target family"
            )


# ---- EAGLE-3 ---------------------------------------------------------------------------------

def eagle3_to_engine(state: dict, prefix: str) -> dict:
    """prefix 'midlayer.' (vLLM / SGLang) or 'layers.0.' (speculators)."""
    out = {}
    for name, tensor in state.items():
        if name == "layer.input_layernorm.weight":
            out[f"{prefix}hidden_norm.weight"] = tensor
        elif name == "embed_norm.weight":
            out[f"{prefix}input_layernorm.weight"] = tensor
        elif name.startswith("layer."):
            out[prefix + name.removeprefix("layer.")] = tensor
        else:
            out[name] = tensor
    return out


def eagle3_from_engine(tensors: dict) -> dict:
    state = {}
    for name, tensor in tensors.items():
        layer = re.match(r"(midlayer\.|layers\.0\.)(.*)", name)
        if layer and layer[2] == "hidden_norm.weight":
            state["layer.input_layernorm.weight"] = tensor
        elif layer and layer[2] == "input_layernorm.weight":
            state["embed_norm.weight"] = tensor
        elif layer:
            state["layer." + layer[2]] = tensor
        elif name in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"):
            state[name] = tensor
    return state
