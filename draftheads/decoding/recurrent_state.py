"""Targets whose layers keep a recurrent state (Qwen3-Next and Qwen3.5's Gated DeltaNet, Mamba hybrids).

A key/value cache is cut back to the accepted path after a verification; a recurrent state cannot be: it has
already absorbed every verified token, the rejected ones included. vLLM and SGLang keep one state per draft
position from inside their kernels. Without forking the target's modeling code, we keep the state as it was before
the verification and, when a chain is not accepted whole, rebuild it: restore the saved state, drop the path's
keys and values, and feed the accepted tokens once more (`Replay`). A fully accepted chain costs nothing extra;
a partly accepted one costs a second forward over the accepted tokens. Trees cannot verify on such a target (the
state has no branches) and rows of a batch cannot be rebuilt apart: chains, one row at a time.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_family import recurrent_layers
from draftheads.core.tree import DynamicTreeSpec, Tree


def has_recurrent_state(target) -> bool:
    return bool(recurrent_layers(target.config))


def check_recurrent_target(target, spec: Tree | DynamicTreeSpec | None, rows: int) -> None:
    """Refuse, in one line, what a recurrent target cannot verify: a tree with branches, or several rows at once."""
    if not has_recurrent_state(target):
        return
    kind = target.config.get_text_config(decoder=True).model_type
    if spec is not None and not (isinstance(spec, Tree) and spec.is_chain):
        raise DraftheadsError(f"this {kind} target's linear-attention layers keep a recurrent state a tree's branches "
                              "cannot share; verify a chain (tree chain:K)")
    if rows > 1:
        raise DraftheadsError(f"this {kind} target's linear-attention layers keep a recurrent state that rows "
                              "accepting different drafts cannot rebuild together; decode one prompt at a time "
                              "(batch size 1)")


class Replay:
    """The recurrent layers' state before a verification, to rebuild the state of the accepted path from."""

    def __init__(self, cache):
        self.layers = [layer for layer in cache.layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
        self.saved = [({i: _clone(t) for i, t in layer.conv_states.items()},
                       {i: _clone(t) for i, t in layer.recurrent_states.items()},
                       dict(layer.has_previous_state)) for layer in self.layers]

    def restore(self, cache, accepted: int) -> None:
        """Put the saved states back and drop the last `accepted` keys and values of every other layer: the cache as
        it was before the verification, ready to be fed the accepted tokens."""
        for layer, (conv, recurrent, previous) in zip(self.layers, self.saved):
            for i in conv:
                if conv[i] is not None:
                    layer.conv_states[i].copy_(conv[i])
                if recurrent[i] is not None:
                    layer.recurrent_states[i].copy_(recurrent[i])
            layer.has_previous_state = dict(previous)
        for layer in cache.layers:
            if getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None:
                layer.keys, layer.values = layer.keys[..., :-accepted, :], layer.values[..., :-accepted, :]


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.clone()
