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

from draftheads.core.target_family import (FULL, KV_FEATURE, RECURRENT_TYPES, SLIDING, reads_kv, recurrent_layers,
                                           sliding_windows)
from draftheads.core.tree import Tree
from draftheads.decoding.tree_tensors import ancestor_matrix, attention_mask, depth_tensor, position_ids


@dataclass
class TargetOutput:
    """logits: [b, s, V] next-token logits per input position (prefill: last position only, s = 1).
    features: [b, s, F] the drafter's features (verify.gather_features), concatenated; None if not asked."""

    logits: torch.Tensor
    features: torch.Tensor | None


def new_cache(target) -> DynamicCache:
    """An empty cache for the target: of the kind its own generate() would build, except that sliding-window layers
    keep every position like the others. A tree's nodes are compacted by slot index in every layer at once, and the
    window is applied by the masks (`layer_masks`) instead of by dropping old entries."""
    window, _ = sliding_windows(target.config)
    if window is not None and not recurrent_layers(target.config):
        return DynamicCache()
    return DynamicCache(config=target.config)


def layer_masks(target, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
    """The attention mask(s) a verification forward passes: `mask` [b, 1, n, k] (additive) as it is, or, where the
    target has sliding-window layers, also windowed (a query at position q sees keys at positions > q - window, as
    transformers' own sliding masks do) and given per layer type. Recurrent layers see no mask: their state is the
    prefix, and a chain's tokens come in order."""
    window, every_layer = sliding_windows(target.config)
    types = set(getattr(target.config.get_text_config(decoder=True), "layer_types", None) or [])
    if window is not None:
        far = (query_positions[:, :, None] - key_positions[:, None, :]) >= window   # [b, n, k]
        windowed = mask.masked_fill(far[:, None].to(mask.device), torch.finfo(mask.dtype).min)
        if every_layer and not types:
            return windowed
    if types <= {FULL}:
        return mask
    return {kind: windowed if kind == SLIDING else (None if kind in RECURRENT_TYPES else mask) for kind in types}


def gather_features(out, layers: tuple) -> torch.Tensor | None:
    """The features `layers` name from a target forward's output: hidden states (indices into out.hidden_states,
    embeddings first, last = after the final norm) and, for "kv:<type>" (core/target_family.KV_FEATURE), the keys
    then values its last layer of that type stored, of the forward's new positions, flattened: [b, s, F]."""
    if not layers:
        return None
    hidden = out.hidden_states
    n = hidden[-1].shape[1]
    parts = []
    for layer in layers:
        if isinstance(layer, str):
            keys, values = out.shared_kv_states[layer[len(KV_FEATURE):]]   # [b, kv heads, past + n, d]
            parts += [per_position(keys[:, :, -n:]), per_position(values[:, :, -n:])]
        else:
            parts.append(hidden[layer])
    return torch.cat([p.to(hidden[-1].dtype) for p in parts], dim=-1)


def per_position(states: torch.Tensor) -> torch.Tensor:
    """[b, heads, n, d] -> [b, n, heads * d]."""
    b, heads, n, d = states.shape
    return states.transpose(1, 2).reshape(b, n, heads * d)


def feature_outputs(feature_layers) -> dict:
    """The forward arguments that make a target hand out the features `feature_layers` name."""
    wanted = {"output_hidden_states": bool(feature_layers)}
    return {**wanted, "return_shared_kv_states": True} if reads_kv(feature_layers) else wanted


@torch.no_grad()
def prefill(target, input_ids: torch.Tensor, cache: DynamicCache, feature_layers: tuple[int, ...] = (),
            attention_mask: torch.Tensor | None = None) -> TargetOutput:
    """Run the prompts [b, s] into the empty cache. Logits for the last position only ([b, 1, V]).

    Prompts of different lengths come left-padded with `attention_mask` [b, s] (1 for real tokens);
    each row's positions then count its own tokens only."""
    positions = None if attention_mask is None else (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = target(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, cache=cache,
                 use_cache=True, logits_to_keep=1, **feature_outputs(feature_layers))
    return TargetOutput(out.logits, gather_features(out, feature_layers))


@torch.no_grad()
def verify(target, cache: DynamicCache, tokens: torch.Tensor, tree: Tree | list[Tree],
           feature_layers: tuple[int, ...] = (), valid: torch.Tensor | None = None) -> TargetOutput:
    """One target forward over the trees' tokens [b, N] on top of the cache -> logits [b, N, V].

    `tree` is every row's, or a list with one per row (tokens right-padded to the largest; a padding
    node sees only itself). `valid` [b, L] marks the cache slots that hold each row's committed tokens
    (None: all of them), so row b's nodes sit at positions valid[b].sum() + depth. The cache grows by
    N entries (in node order); call `compact_cache` once the paths are accepted.
    """
    b, n = tokens.shape
    trees = tree if isinstance(tree, list) else [tree] * b
    if any(t.num_nodes > n for t in trees) or (not isinstance(tree, list) and tree.num_nodes != n):
        raise ValueError(f"proposal has {n} tokens but its trees have {[t.num_nodes for t in trees]} nodes")
    prefix = cache.get_seq_length()
    if valid is None and not isinstance(tree, list):  # one tree over whole rows: the mask every row shares
        mask = attention_mask(tree, prefix, dtype=target.dtype, device=tokens.device)
        positions = position_ids(tree, prefix, device=tokens.device).expand(b, -1)
        keys = torch.cat([torch.arange(prefix, device=tokens.device)[None].expand(b, -1), positions], 1)
    else:
        mask, positions, keys = row_masks(trees, n, prefix, valid, target.dtype, tokens.device)
    out = target(input_ids=tokens, attention_mask=layer_masks(target, mask, positions, keys), position_ids=positions,
                 cache=cache, use_cache=True, **feature_outputs(feature_layers))
    return TargetOutput(out.logits, gather_features(out, feature_layers))


def row_masks(trees: list[Tree], n: int, prefix: int, valid: torch.Tensor | None, dtype, device):
    """([b, 1, n, prefix + n] additive mask, [b, n] positions, [b, prefix + n] key positions) for one tree per row
    over its committed slots."""
    b = len(trees)
    visible = torch.zeros(b, n, prefix + n, dtype=torch.bool)
    positions = torch.zeros(b, n, dtype=torch.long)
    committed = valid.cpu() if valid is not None else torch.ones(b, prefix, dtype=torch.bool)
    for row, tree in enumerate(trees):
        visible[row, :, :prefix] = committed[row]
        visible[row, : tree.num_nodes, prefix : prefix + tree.num_nodes] = ancestor_matrix(tree)
        pad = torch.arange(tree.num_nodes, n)
        visible[row, pad, prefix + pad] = True  # padding nodes see themselves: no row of the softmax is empty
        positions[row, : tree.num_nodes] = depth_tensor(tree) + int(committed[row].sum())
        positions[row, tree.num_nodes :] = int(committed[row].sum())
    keys = torch.cat([(committed.long().cumsum(-1) - 1).clamp(min=0), positions], 1)  # unused slots are hidden
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[:, None].to(device), positions.to(device), keys.to(device)


def compact_cache(cache: DynamicCache, num_nodes: int, keep, valid: torch.Tensor | None = None) -> torch.Tensor | None:
    """Of the last `num_nodes` cached entries (the verified trees), keep only nodes `keep`, in order.

    keep: [n] for every row, or a list with each row's [n_b]. With `valid` [b, L] (which earlier slots hold
    committed tokens) or per-row keeps, every row keeps its committed slots and its path; rows that keep
    fewer are padded at the front with slots marked invalid. Returns the new valid [b, L'] (None for the
    shared keep without `valid`: every slot is committed).
    """
    layers = [layer for layer in cache.layers if getattr(layer, "is_initialized", False)]
    if not layers:
        return valid
    length = layers[0].keys.shape[-2]
    prefix = length - num_nodes
    if valid is None and not isinstance(keep, list):
        index, new_valid = torch.cat([torch.arange(prefix), prefix + keep.cpu().long()]), None
    else:
        b = layers[0].keys.shape[0]
        keeps = keep if isinstance(keep, list) else [keep] * b
        committed = valid.cpu() if valid is not None else torch.ones(b, prefix, dtype=torch.bool)
        rows = [torch.cat([committed[r].nonzero()[:, 0], prefix + keeps[r].cpu().long()]) for r in range(b)]
        width = max(len(r) for r in rows)
        index = torch.stack([torch.cat([r.new_zeros(width - len(r)), r]) for r in rows])  # [b, width]
        new_valid = torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]
    for layer in layers:
        if index.dim() == 1:
            at = index.to(layer.keys.device)
            layer.keys, layer.values = layer.keys.index_select(-2, at), layer.values.index_select(-2, at)
        else:   # keys and values may differ in width (MLA: DeepSeek-V3's rope part rides on the keys only)
            layer.keys, layer.values = gather_slots(layer.keys, index), gather_slots(layer.values, index)
        if hasattr(layer, "cumulative_length"):  # sliding-window layers count positions separately
            layer.cumulative_length -= length - index.shape[-1]
    return None if new_valid is None else new_valid.to(valid.device if valid is not None else "cpu")


def gather_slots(cached: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cached [b, heads, L, d] at each row's slots index [b, L'] -> [b, heads, L', d]."""
    at = index.to(cached.device)[:, None, :, None].expand(-1, cached.shape[1], -1, cached.shape[-1])
    return cached.gather(-2, at)
