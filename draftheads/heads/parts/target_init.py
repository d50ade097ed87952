"""`head.init: target_layer`: a new drafter starts from the target's own weights instead of random ones.

At 6-35 minute budgets the first hundred steps are a large share of training, and a random draft layer spends them
learning what the target's layers already compute. So:

- each draft decoder layer starts as a copy of one of the target's last layers (the last one for a single layer;
  the last L, in order, for a stack of L; the last one for every MTP module, each of which continues from the
  target's output): every tensor whose name and shape match is copied. EAGLE-3's q/k/v read
  [emb; h] (2H): their h columns get the target's weights and the embedding columns keep their fresh init, small
  beside them, for training to grow;
- the fusion (EAGLE-3's fc over three layers, DFlash's over its target layers, EAGLE's and MTP's over [emb; h]) starts
  as the identity on the highest layer's features and zero elsewhere, so the draft layer first reads what the
  target's next layer would.

A drafter takes part by offering `draft_layers()` (its decoder layers) and `fusion_inputs()` (each fusion Linear and
the first column of the features it should pass through).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from draftheads.core.config import doc
from draftheads.core.errors import DraftheadsError

Init = Literal["random", "target_layer"]


def init_setting():
    """head.init, the same setting on every head that can start from the target's layers."""
    return doc("random", "a new drafter's weights: random, or target_layer (its draft layers copied from the target's "
                         "last layers, its fusion the identity on the highest features)")

def target_decoder_layers(target) -> nn.ModuleList:
    """The target's decoder layers, in order."""
    base = target.get_base_model() if hasattr(target, "get_base_model") else target
    layers = getattr(base.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise DraftheadsError(f"head.init: target_layer copies the target's decoder layers, but {type(base).__name__} "
                              "keeps no decoder.layers list; use head.init: random")
    return layers


@torch.no_grad()
def init_from_target(drafter, target) -> list[str]:
    """Copy the target's last decoder layers into the drafter's and make its fusions the identity on the highest
    features. Returns the names of the draft-layer tensors left at their fresh init (no counterpart in the target)."""
    source = list(target_decoder_layers(target))
    layers = drafter.draft_layers()
    if getattr(drafter, "modules_follow_the_last_layer", False):
        originals = [source[-1]] * len(layers)  # MTP: every module continues from the target's output
    elif len(layers) > len(source):
        raise DraftheadsError(f"head.init: target_layer copies one target layer per draft layer, but the drafter has "
                              f"{len(layers)} and the target {len(source)}; use head.init: random")
    else:
        originals = source[len(source) - len(layers):]
    left = []
    for i, (layer, original) in enumerate(zip(layers, originals)):
        left += [f"layer {i}: {name}" for name in copy_matching(layer, original)]
    for linear, start in drafter.fusion_inputs():
        pass_through(linear, start)
    return left


def copy_matching(layer: nn.Module, original: nn.Module) -> list[str]:
    """Copy each of `original`'s tensors into `layer`'s of the same name: whole when the shapes match, into the last
    columns when `layer`'s reads more inputs (EAGLE-3's [emb; h] q/k/v). Returns the names left as they were."""
    theirs = dict(original.named_parameters())
    left = []
    for name, mine in layer.named_parameters():
        weight = theirs.get(name)
        if weight is not None and weight.shape == mine.shape:
            mine.copy_(weight.to(mine.dtype))
        elif weight is not None and weight.dim() == 2 and mine.shape[0] == weight.shape[0] \
                and mine.shape[1] > weight.shape[1]:
            mine[:, -weight.shape[1]:] = weight.to(mine.dtype)  # h is the attention input's last half
        else:
            left.append(name)
    return left


def pass_through(linear: nn.Linear, start: int) -> None:
    """linear [out, in] -> the identity on input columns start..start+out, zero elsewhere (and no bias)."""
    out = linear.weight.shape[0]
    if start + out > linear.weight.shape[1]:
        raise DraftheadsError(f"fusion identity: columns {start}..{start + out} do not fit {linear.weight.shape[1]}"
                              " inputs; this is a bug")
    linear.weight.zero_()
    linear.weight[:, start:start + out] = torch.eye(out, dtype=linear.weight.dtype, device=linear.weight.device)
    if linear.bias is not None:
        linear.bias.zero_()
