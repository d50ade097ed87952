"""One decoder layer of the target's own class (no forked modeling code), and how to run it.

EAGLE and MTP both build a layer from a copy of the target's config and run it over their own
KV cache with explicit position ids, the target's rotary embedding and a 4D additive mask — the
same call in training (causal or training-time-test masks) and in drafting (tree masks).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_family import (
    LayerRotary,
    TargetEmbedding,
    TargetHead,
    norm_eps,
    one_layer_config,
    whole_head_rope,
)
from draftheads.heads.parts.common import bind_frozen, decoder_layer_class

ATTENTION_INPUTS = ("q_proj", "k_proj", "v_proj")


def draft_layer_config(target_config):
    """A one-layer copy of the target's (text) config for a draft layer (core/target_family.one_layer_config).

    Tree masks need an attention kernel that takes an arbitrary 4D mask: eager or SDPA.
    """
    config = one_layer_config(target_config)
    if config._attn_implementation not in ("eager", "sdpa"):
        config._attn_implementation = "sdpa"
    return config


def build_decoder_layer(target_config, kind: str = "target", overrides: dict | None = None) -> nn.Module:
    """A freshly initialised decoder layer (layer index 0 of its own cache): of the target's class ('target'), or a
    Llama layer with the target's sizes ('llama', the layer every engine's EAGLE-3 class builds). `overrides` are
    config fields set on the one-layer config (e.g. first_k_dense_replace: 0 for the MoE layer a DeepSeek-V3
    checkpoint's MTP module is)."""
    if kind == "llama":
        return LlamaDecoderLayer(llama_layer_config(target_config), 0)
    config = draft_layer_config(target_config)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    layer = built_with_nan_for_empty(lambda: decoder_layer_class(target_config)(config, 0))
    initialise_what_the_model_would(layer, config, pretrained_class(target_config))
    return layer


def built_with_nan_for_empty(build):
    """build(), with the memory torch.empty hands out filled with NaN (torch's deterministic mode does that), so that
    parameters a constructor leaves uninitialised can be told apart. Random draws are unchanged."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        return build()
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def initialise_what_the_model_would(layer: nn.Module, config, model_class: type) -> None:
    """Initialise the parameters `layer`'s constructor left empty, as its model class does when it is built.

    transformers' MoE experts and routers (Mixtral, Qwen3-MoE, GLM-4 MoE, DeepSeek-V3) are torch.empty in their
    constructors and initialised only by the model's _init_weights: a layer built on its own held whatever memory it
    was given, NaN or 1e21 on one machine and near zero on another. Modules whose parameters the constructor did set
    are left alone, so every other layer keeps the initialisation (and the random draws) it had."""
    left = [m for m in layer.modules() if any(p.is_floating_point() and not p.is_meta and torch.isnan(p).any()
                                              for p in m.parameters(recurse=False))]   # meta: a shape check only
    if not left:
        return
    model = model_class(config)   # the family's PreTrainedModel holds only the config: no layers are built
    with torch.no_grad():
        for module in left:
            model._init_weights(module)
    still = [name for name, p in layer.named_parameters() if p.is_floating_point() and torch.isnan(p).any()]
    if still:
        raise DraftheadsError(f"the {type(layer).__name__} draft layer leaves {', '.join(still)} uninitialised and "
                              f"{type(model).__name__} does not initialise them; this target's layer class is not "
                              "supported as a draft layer (head.draft_layer: llama builds a Llama layer)")


def pretrained_class(target_config) -> type:
    """The target family's PreTrainedModel class: the one whose _init_weights its causal-LM class inherits."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(target_config)]
    return next(c for c in model_class.__mro__ if "_init_weights" in vars(c))


def llama_layer_config(target_config):
    """A one-layer LlamaConfig with the attention, MLP, rope and norm sizes of the target's global layers.

    Engines' EAGLE-3 drafters are Llama layers whatever the target (SGLang and llama.cpp have no other, SpecForge
    and speculators train them for Qwen targets too): no q/k norms, no biases, SiLU. The target's rope base and
    scaling are kept, over whole heads (core/target_family.whole_head_rope): the engines build the same one from
    these fields."""
    t = one_layer_config(target_config)
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    config = LlamaConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=1,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", None) or t.num_attention_heads,
        head_dim=head_dim, hidden_act="silu", max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=norm_eps(t), attention_bias=False, mlp_bias=False,
        rope_parameters=whole_head_rope(t), bos_token_id=getattr(t, "bos_token_id", None),
        eos_token_id=getattr(t, "eos_token_id", None), pad_token_id=getattr(t, "pad_token_id", None),
        tie_word_embeddings=False,
    )
    config._attn_implementation = t._attn_implementation if t._attn_implementation in ("eager", "sdpa") else "sdpa"
    return config


def make_norm(layer: nn.Module, dim: int, eps: float) -> nn.Module:
    """An RMSNorm of the target's own class (e.g. Gemma's 1+w variant), taken from the layer."""
    norm = getattr(layer, "post_attention_layernorm", None)
    if norm is None:
        return nn.RMSNorm(dim, eps=eps)
    return type(norm)(dim, eps=eps)


def widen_attention_inputs(layer: nn.Module, in_features: int) -> None:
    """Make the q/k/v projections read `in_features` inputs (EAGLE-3 attends over [emb; h], 2H)."""
    attn = layer.self_attn
    for name in ATTENTION_INPUTS:
        old = getattr(attn, name, None)
        if not isinstance(old, nn.Linear):
            raise DraftheadsError(
                f"EAGLE-3 widens separate q/k/v projections, but {type(attn).__name__} has no '{name}'; "
                "use head.draft_layer: llama (the default) or head.type: eagle"
            )
        setattr(attn, name, nn.Linear(in_features, old.out_features, bias=old.bias is not None))


class KVCache:
    """The keys and values of one draft layer: grows by `update`, cut back by `truncate`.

    Minimal on purpose: the attention modules only call `update`, and our own cut-back rule
    (drop whatever drafting added) is simpler than the version-dependent `DynamicCache.crop`.
    """

    def __init__(self):
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """keys/values [b, heads, n, d] appended; returns everything cached."""
        if self.keys is not None:
            keys = torch.cat([self.keys, keys], dim=-2)
            values = torch.cat([self.values, values], dim=-2)
        self.keys, self.values = keys, values
        return keys, values

    def detach(self) -> None:
        """Keep the cached keys and values but stop gradients through them (HASS's harmonised unroll)."""
        if self.keys is not None:
            self.keys, self.values = self.keys.detach(), self.values.detach()

    def truncate(self, length: int) -> None:
        if self.keys is not None:
            self.keys = self.keys[..., :length, :]
            self.values = self.values[..., :length, :]


@functools.cache
def _call_convention(layer_class: type) -> tuple[str, bool]:
    """(the cache argument's name, whether the layer wants a dict to share its keys and values in) of a decoder
    layer class: transformers renamed `past_key_values` to `cache`, and Gemma 4's layers store their keys for later
    layers in `shared_kv_states`. Once per class: inspecting the signature on every draft step costs more than the
    step's small matmuls."""
    params = inspect.signature(layer_class.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "shared_kv_states" in params


def run_layer(
    layer: nn.Module,
    rotary: nn.Module,
    hidden: torch.Tensor,
    position_ids: torch.Tensor,
    visible: torch.Tensor,
    cache: KVCache | None = None,
    **extra,
) -> torch.Tensor:
    """One decoder-layer forward.

    hidden [b, n, H]; position_ids [b or 1, n]; visible [b or 1, n, k] bool (k = cached + n keys,
    True where query i may attend key j); extra keyword arguments go down to the attention.
    Returns [b, n, H].
    """
    if position_ids.shape[0] != hidden.shape[0]:
        position_ids = position_ids.expand(hidden.shape[0], -1)
    cos_sin = rotary(hidden, position_ids)
    mask = additive_mask(visible, hidden.dtype)
    cache_argument, shares_kv = _call_convention(type(layer))
    kwargs = {cache_argument: cache, "use_cache": cache is not None}
    if shares_kv:
        kwargs["shared_kv_states"] = {}   # a draft layer shares with no later layer
    out = layer(hidden, attention_mask=mask, position_ids=position_ids, position_embeddings=cos_sin, **kwargs, **extra)
    return out[0] if isinstance(out, tuple) else out


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[b, q, k] bool -> [b, 1, q, k] additive mask (0 visible, dtype-min hidden)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill(~visible, torch.finfo(dtype).min)[:, None]


def causal_visible(position_ids: torch.Tensor | None, b: int, n: int, past: int = 0, device=None) -> torch.Tensor:
    """[b or 1, n, past + n] bool: causal over `past` cached keys and n new ones.

    With packed rows (position_ids restarting at 0 for each sample) a query sees only keys of
    its own sample; `past` must then be 0.
    """
    q = torch.arange(n, device=device)[:, None] + past
    k = torch.arange(past + n, device=device)[None, :]
    visible = (k <= q)[None]
    if position_ids is not None and past == 0:
        segment = (position_ids == 0).cumsum(-1)  # [b, n]
        visible = visible & (segment[:, :, None] == segment[:, None, :])
    return visible


def target_parts(target) -> dict:
    """The frozen target modules a drafter shares: embedding and lm_head as its family applies them
    (core/target_family: TargetEmbedding, TargetHead), and the final norm."""
    base = target.get_base_model() if hasattr(target, "get_base_model") else target  # peft-wrapped target
    decoder = base.get_decoder()
    if not hasattr(decoder, "norm"):
        raise DraftheadsError(f"{type(decoder).__name__} has no final norm; this target is not supported by "
                              "EAGLE/MTP/DFlash")
    return {
        "embed": TargetEmbedding(base.get_input_embeddings(), base.config),
        "lm_head": TargetHead(base.get_output_embeddings(), base.config),
        "norm": decoder.norm,
    }


def bind_parts(owner: nn.Module, target, label: str, names: tuple[str, ...], rotary: LayerRotary | None = None) -> None:
    """Attach the target's frozen `names` (of target_parts) to `owner` as `_<name>`, after checking the
    target has the hidden size and vocabulary owner was built for (`label` names the drafter in errors); and the
    draft layer's `rotary` as `_rotary`, on the target's device."""
    parts = target_parts(target)
    out_features, in_features = parts["lm_head"].weight.shape
    if (in_features, out_features) != (owner.hidden_size, owner.vocab_size):
        raise DraftheadsError(
            f"this {label} drafter was built for hidden size {owner.hidden_size} and vocab {owner.vocab_size}, "
            f"but the target has {in_features} and {out_features}; use the target it was trained on"
        )
    bind_frozen(owner, **{f"_{name}": parts[name] for name in names})
    if rotary is not None:
        bind_frozen(owner, _rotary=rotary.to(parts["lm_head"].weight.device))


def ttt_visible(step: int, n: int, position_ids: torch.Tensor | None = None, device=None) -> torch.Tensor:
    """[b or 1, n, (step + 1) n] bool: what step `step` of a training-time-test unroll sees.

    Keys are laid out by step: block 0 holds the keys computed from the target's own features,
    block i those of unroll step i. The query at position p of step j drafts depth j+1 from the
    anchor a = p - j, so, exactly as at inference, it sees block 0 up to a and, in each block
    i = 1..j, the single key at a + i (its own drafted ancestors, and itself).
    """
    p = torch.arange(n, device=device)[:, None]
    c = torch.arange(n, device=device)[None, :]
    block0 = (c <= p - step)[None]
    if position_ids is not None:
        segment = (position_ids == 0).cumsum(-1)  # packed samples never see each other
        block0 = block0 & (segment[:, :, None] == segment[:, None, :])
    blocks = [block0] + [(c == p - step + i)[None].expand(block0.shape[0], -1, -1) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=-1)


def tree_visible(nodes: list[int], parents: list[int], columns: dict[int, int], width: int, committed: int,
                 device=None):
    """[1, n, width] bool: tree `nodes` fed on top of a cache, `width` keys in all (new ones included).

    The first `committed` keys (the prefix) are visible to all; every other key belongs to a tree
    node (`columns`: node -> key index, the nodes fed now included) and is visible to that node
    and its descendants: each node sees the prefix, its drafted ancestors and itself.
    """
    visible = torch.zeros(len(nodes), width, dtype=torch.bool)
    visible[:, :committed] = True
    for i, node in enumerate(nodes):
        while node > 0:  # the root's own key is the last committed one
            if node in columns:
                visible[i, columns[node]] = True
            node = parents[node]
    return visible[None].to(device)
