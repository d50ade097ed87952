"""Target forwards for speculative decoding: prefill, one-forward tree verification, KV compaction.

The target's KV cache always holds every committed token except the pending one. Verification
feeds the whole draft tree (root = pending token) in one forward on top of the cache, with a 4D
additive mask (each node sees the prefix and its ancestors) and position ids prefix + depth, so
node i's logits are exactly the target's next-token logits after the path root..i. Afterwards the
cache is compacted to the prefix plus the accepted path: the cache plain decoding would hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree


@dataclass
class TargetOutput:
    """logits: [b, s, V] next-token logits per input position (prefill: last position only, s = 1).
    features: [b, s, F] hidden states at the drafter's feature layers, concatenated; None if not asked."""

    logits: torch.Tensor
    features: torch.Tensor | None


def new_cache(target) -> DynamicCache:
    """An empty cache of the kind the target's own generate() would build."""
    return DynamicCache(config=target.config)


def sliding_window(target) -> int | None:
    """The smallest sliding attention window of the target, or None if it attends to everything."""
    config = target.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def check_length(target, total_len: int) -> None:
    """Tree masks and compaction assume every cached position is kept: refuse to outgrow a sliding window."""
    window = sliding_window(target)
    if window is not None and total_len >= window:
        raise DraftheadsError(
            f"this target uses sliding-window attention (window {window}) and the prompt plus new tokens plus the draft "
            f"tree need {total_len} positions; lower max_new_tokens or shorten the prompt"
        )


def gather_features(hidden_states, layers: tuple[int, ...]) -> torch.Tensor | None:
    """hidden_states: tuple of [b, s, H] (embeddings first, last = after the final norm) -> [b, s, len(layers) * H]."""
    if not layers:
        return None
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


@torch.no_grad()
def prefill(target, input_ids: torch.Tensor, cache: DynamicCache, feature_layers: tuple[int, ...] = ()) -> TargetOutput:
    """Run the prompt [b, s] into the empty cache. Logits for the last position only ([b, 1, V])."""
    out = target(
        input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=bool(feature_layers)
    )
    return TargetOutput(out.logits, gather_features(out.hidden_states, feature_layers))


@torch.no_grad()
def verify(
    target, cache: DynamicCache, tokens: torch.Tensor, tree: Tree, feature_layers: tuple[int, ...] = ()
) -> TargetOutput:
    """One target forward over the tree's tokens [b, N] on top of the cache -> logits [b, N, V].

    The cache grows by N entries (in node order); call `compact_cache` once a path is accepted.
    """
    b, n = tokens.shape
    if n != tree.num_nodes:
        raise ValueError(f"proposal has {n} tokens but its tree has {tree.num_nodes} nodes")
    prefix = cache.get_seq_length()
    mask = tree.attention_mask(prefix, dtype=target.dtype, device=tokens.device)
    positions = tree.position_ids(prefix, device=tokens.device).expand(b, -1)
    out = target(
        input_ids=tokens,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        output_hidden_states=bool(feature_layers),
    )
    return TargetOutput(out.logits, gather_features(out.hidden_states, feature_layers))


def compact_cache(cache: DynamicCache, num_nodes: int, keep: torch.Tensor) -> None:
    """Keep the prefix and, of the last `num_nodes` cached entries (the verified tree), only nodes `keep` [n], in order.

    Gathers along the sequence axis of every layer's keys/values [b, h, s, d]; rows of a batch share `keep`.
    """
    keep = keep.to(torch.long)
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        prefix = layer.keys.shape[-2] - num_nodes
        index = torch.cat([torch.arange(prefix, device=keep.device), prefix + keep]).to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
        if hasattr(layer, "cumulative_length"):  # sliding-window layers count positions separately
            layer.cumulative_length -= num_nodes - keep.numel()
