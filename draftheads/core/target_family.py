"""What a target's family does differently from Llama, read from its config and its own classes, in one place.

Heads and the decoding loop ask this module; nothing else calls a target class with a family-specific signature.

- **Rotary embedding.** A draft layer's rotary is built from that layer's own config by the class its family uses,
  and called with the layer's type where the family keeps one rotary per type (Gemma 3 and 4: local layers and
  global ones have different bases; Gemma 4's global layers also rotate a part of a wider head). Partial rotary
  (Qwen3-Next, Qwen3.5, GLM-4.5) stays with the target's own layer class, whose attention rotates that part; a
  Llama- or Qwen3-style draft layer (EAGLE-3, P-EAGLE, DFlash), which rotates whole heads, gets the target's base
  and scaling over its whole head, as the engines that load those drafters build it.
- **Output head.** The target's logits are not always lm_head(h): Gemma 2/3/4 soft-cap them, Cohere scales them,
  Granite divides them. `TargetHead` is the lm_head with that transform, so soft labels are the target's own
  distribution and a drafter sharing the head drafts from the same one.
- **Input embedding.** Gemma scales its embeddings by sqrt(H) inside its embedding module; Granite multiplies them
  in the model's forward. `TargetEmbedding` gives what the first layer sees.
- **Attention kernel.** Families transformers offers no SDPA for (Gemma 2's soft-capped attention) load with eager.
- **Sliding windows and recurrent state**: which layers see a window and which keep a state that cannot be cut
  back after a rejected draft (Gemma 2/3, Cohere 2, Mistral; Qwen3-Next and Qwen3.5's linear attention).
"""

from __future__ import annotations

import copy
import inspect
import sys

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from draftheads.core.target_dims import text_config

FULL, SLIDING = "full_attention", "sliding_attention"
RECURRENT_TYPES = ("linear_attention", "mamba", "conv", "recurrent")
# a drafter feature that is not a hidden state: "kv:<layer type>", the keys and values the target's last layer of that
# type stores for later layers (Gemma 4's KV sharing; its assistant drafters attend to them), flattened per position
KV_FEATURE = "kv:"


def kv_feature(layer_type: str) -> str:
    return KV_FEATURE + layer_type


def reads_kv(feature_layers) -> bool:
    """Whether any of a drafter's features is a target layer's stored keys and values."""
    return any(isinstance(layer, str) and layer.startswith(KV_FEATURE) for layer in feature_layers)


# ---- a layer's config ---------------------------------------------------------------------------------------------

def layer_config(config, index: int):
    """The config of target layer `index`: where sizes differ by layer (Gemma 4's global layers have wider heads),
    transformers keeps one view per layer, and the global config refuses to answer for them."""
    t = text_config(config)
    return t.per_layer_config[index] if getattr(t, "is_heterogeneous", False) else t


def global_layer(config) -> int:
    """The last layer that attends to everything and rotates (SmolLM3's NoPE layers do not): the layer a draft layer
    of the target's class is built like."""
    t = text_config(config)
    types = getattr(t, "layer_types", None) or [FULL] * t.num_hidden_layers
    rotates = getattr(t, "no_rope_layers", None) or [1] * t.num_hidden_layers
    candidates = [i for i, kind in enumerate(types) if kind == FULL and rotates[i]]
    return candidates[-1] if candidates else t.num_hidden_layers - 1


def one_layer_config(config):
    """A one-layer copy of the target's text config for a draft layer of its class: the sizes of its last global
    layer, full attention (draft contexts are short), no per-layer inputs or shared KV (Gemma 4's PLE and KV
    sharing reach across layers a draft layer does not have), rotary on (SmolLM3's NoPE layers)."""
    out = copy.deepcopy(layer_config(config, global_layer(config)))
    out.num_hidden_layers = 1
    if getattr(out, "layer_types", None):
        out.layer_types = [FULL]
    for name, value in (("hidden_size_per_layer_input", 0), ("num_kv_shared_layers", 0), ("no_rope_layers", [1])):
        if getattr(out, name, None) is not None:
            setattr(out, name, value)
    return out


def norm_eps(config) -> float:
    """The epsilon of the target's norms (RMSNorm's, or LayerNorm's for Cohere)."""
    t = text_config(config)
    return float(getattr(t, "rms_norm_eps", None) or getattr(t, "layer_norm_eps", None) or 1e-6)


# ---- rotary -------------------------------------------------------------------------------------------------------

class LayerRotary:
    """cos/sin for one draft layer: `rotary(x, position_ids)` whatever its family's rotary takes.

    Not an nn.Module of the drafter on purpose: its buffers are derived from the config, never trained or saved, and
    must not be cast to the drafter's dtype (bf16 inverse frequencies would rotate far-away positions wrongly)."""

    def __init__(self, config, rotary_class: type, layer_type: str | None):
        self.module = rotary_class(config)
        takes_type = "layer_type" in inspect.signature(self.module.forward).parameters
        self.layer_type = (layer_type or FULL) if takes_type else None

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor):
        if self.layer_type is None:
            return self.module(x, position_ids)
        return self.module(x, position_ids, self.layer_type)

    def to(self, device) -> "LayerRotary":
        self.module.to(device)
        return self


def layer_type(config, index: int) -> str | None:
    """The attention type of layer `index` ('full_attention', 'sliding_attention', 'linear_attention', ...)."""
    types = getattr(text_config(config), "layer_types", None)
    return types[index] if types else None


def rotary_class_of(layer: nn.Module) -> type:
    """The rotary-embedding class of a transformers decoder layer's family, from the layer's modeling module."""
    module = sys.modules[type(layer).__module__]
    stem = type(layer).__name__.removesuffix("DecoderLayer")
    for name in (f"{stem}RotaryEmbedding", f"{stem.removesuffix('Text')}TextRotaryEmbedding"):
        if hasattr(module, name):
            return getattr(module, name)
    found = [value for name, value in vars(module).items() if name.endswith("RotaryEmbedding")
             and isinstance(value, type) and "Vision" not in name and "Audio" not in name]
    if len(found) != 1:
        raise TypeError(f"cannot tell the rotary embedding of {type(layer).__name__} among {found}")
    return found[0]


def layer_rotary(layer: nn.Module) -> LayerRotary:
    """The rotary a transformers decoder layer needs: its family's class, built from the layer's own config, called
    with the layer's own type (its attention keeps the config and its index)."""
    attention = layer.self_attn
    config = attention.config
    return LayerRotary(config, rotary_class_of(layer), layer_type(config, attention.layer_idx))


def whole_head_rope(config) -> dict | None:
    """The target's rope for its global layers, rotating whole heads: the parameters of a Llama- or Qwen3-style
    draft layer. Partial rotary is dropped (such a layer rotates every dimension), and a rope type only one family
    knows falls back to the default one of the same base."""
    rope = getattr(text_config(config), "rope_parameters", None)
    if isinstance(rope, dict) and FULL in rope:
        rope = rope[FULL]
    if not rope:
        return None
    rope = {k: v for k, v in dict(rope).items() if k != "partial_rotary_factor"}
    if rope.get("rope_type", "default") not in ROPE_INIT_FUNCTIONS or rope.get("rope_type") == "proportional":
        rope = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    return rope


# ---- the two ends -------------------------------------------------------------------------------------------------

def logit_transform(config):
    """logits -> the target's logits: what its causal-LM class does after lm_head (identity for most families)."""
    t = text_config(config)
    cap = getattr(t, "final_logit_softcapping", None)
    scale = getattr(t, "logit_scale", None)          # Cohere, Cohere 2
    divisor = getattr(t, "logits_scaling", None)     # Granite
    multiplier = 1.0
    if scale is not None:
        multiplier *= float(scale)
    if divisor is not None:
        multiplier /= float(divisor)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if multiplier != 1.0:
            logits = logits * multiplier
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


class TargetHead(nn.Module):
    """The target's frozen lm_head with its family's logit transform. `weight` and `bias` are the lm_head's, so a draft
    vocabulary can take its rows; `finish` applies the transform to logits made from them."""

    def __init__(self, lm_head: nn.Module, config):
        super().__init__()
        object.__setattr__(self, "lm_head", lm_head)   # not registered: never trained, saved or moved through us
        self.finish = logit_transform(config)

    @property
    def weight(self) -> torch.Tensor:
        return self.lm_head.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.lm_head, "bias", None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.finish(self.lm_head(hidden))


class TargetEmbedding(nn.Module):
    """The target's frozen embedding as its first layer sees it: Gemma's sqrt(H) is inside its embedding module;
    Granite's embedding_multiplier is applied by the model, so here."""

    def __init__(self, embedding: nn.Module, config):
        super().__init__()
        object.__setattr__(self, "embedding", embedding)
        self.multiplier = float(getattr(text_config(config), "embedding_multiplier", None) or 1.0)

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.embedding(ids)
        return out * self.multiplier if self.multiplier != 1.0 else out


# ---- attention and state ------------------------------------------------------------------------------------------

def attention_kernel(model_class: type, asked: str) -> str:
    """`asked` ('sdpa' or 'eager'), or eager where transformers offers the family no SDPA (Gemma 2)."""
    if asked == "sdpa" and not getattr(model_class, "_supports_sdpa", True):
        return "eager"
    return asked


def sliding_windows(config) -> tuple[int | None, bool]:
    """(window, every layer slides): the target's sliding attention window, None where it attends to everything."""
    t = text_config(config)
    window = getattr(t, "sliding_window", None)
    if window is None or getattr(t, "use_sliding_window", True) is False:
        return None, False
    types = getattr(t, "layer_types", None)
    if types is None:
        return int(window), True
    if SLIDING not in types:
        return None, False
    return int(window), all(kind == SLIDING for kind in types)


def recurrent_layers(config) -> list[int]:
    """Layers that carry a recurrent state (linear attention, Mamba), which a cache cannot cut back to an earlier
    length: verifying drafts on them needs the state saved before and rebuilt for the accepted tokens."""
    types = getattr(text_config(config), "layer_types", None) or []
    return [i for i, kind in enumerate(types) if kind in RECURRENT_TYPES]
