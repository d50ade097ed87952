"""DFlash — a block-parallel drafter (z-lab, "DFlash: Block Diffusion for Flash Speculative Decoding", 2026).

    context   [h_l1; ...; h_ln] [b, s, nH] -> fc (no bias) -> hidden_norm                  (target features)
    block     emb([x_a, M, ..., M]) [b, B, H] -> L decoder layers reading the context's keys and values
              (heads/parts/block_layer.py) -> norm -> the target's lm_head
    slot k    predicts x_{a+k}, k = 1..B-1: a whole chain (or a tree's levels) drafted in one forward

There is no embedding or lm_head of its own: the target's, frozen (with a draft vocabulary, the lm_head's rows for
it). The target layers are numbered by their outputs, as EAGLE-3's (`target_layers: [l]` reads hidden_states[l + 1]),
which is z-lab's `target_layer_ids`; the mask token M is an existing row of the target's embedding. Training
(heads/parts/block_training.py): random anchors, every block in one forward under a mask, slot weights
exp(-(k-1)/gamma), cross-entropy on the target's tokens or on its distribution (KD). Drafting:
heads/parts/block_drafting.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.target_family import LayerRotary
from draftheads.core.tree import parse_tree
from draftheads.heads.parts.block_drafting import BlockDrafting
from draftheads.heads.parts.block_layer import BlockLayer, block_layer_config
from draftheads.heads.parts.block_training import (
    block_inputs,
    block_labels,
    block_loss,
    block_visible,
    sample_anchors,
)
from draftheads.heads.parts.common import batch_features, bind_frozen, resolve_mask_token
from draftheads.heads.parts.draft_vocab import check_draft_vocab, vocabulary
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.layers import bind_parts
from draftheads.heads.parts.objective import Objective, default_gamma, take_objective
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import drafting_methods, new_for_target, one_param_group

MAX_BLOCK = 32


@dataclass
class DFlashConfig:
    """DFlash hyper-parameters (hidden size, vocabulary, attention and MLP sizes come from the target)."""

    type: Literal["dflash"] = doc("dflash", "head type")
    block_size: int = doc(8, "tokens per block: the pending token and block_size - 1 drafts, made in one forward")
    num_layers: int = doc(1, "draft decoder layers (Qwen3-style, the target's sizes)")
    target_layers: list[int] | None = doc(None, "the target layers whose OUTPUTS form the context, in increasing "
                                                "order (z-lab's target_layer_ids; default: num_layers layers spread "
                                                "from 1 to N-3, or N//2 for one layer, as z-lab picks them)")
    mask_token_id: int | None = doc(None, "the token id of the block's mask slots: an existing row of the target's "
                                          "embedding (default: the last id of the vocabulary)")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens, "
                                             "through the target lm_head's rows for them (default: all)")
    anchors: int = doc(32, "blocks trained per row and step, anchored at random counted positions")
    gamma: float | None = doc(None, "slot k's loss weight is exp(-(k-1)/gamma) (default 4 at block 8, 7 at block 16, "
                                    "on the line through them)")
    loss: Literal["ce", "kd"] = doc("ce", "ce: cross-entropy on the target's tokens; kd: on its distributions "
                                          "(caches the target's last hidden state too)")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:block_size-1)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing drafter (native layout)")

    def __post_init__(self):
        check_block_settings(self)

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        resolve_block_settings(self, num_layers, vocab_size)

    @property
    def depth(self) -> int:
        return self.block_size - 1


def check_block_settings(config) -> None:
    """The head.* checks every block drafter's config shares (DFlash, DSpark): its block drafts config.depth levels."""
    least = config.block_size - config.depth + 1
    check(least <= config.block_size <= MAX_BLOCK, f"head.block_size must be between {least} and {MAX_BLOCK}, "
                                                   f"got {config.block_size}")
    check(1 <= config.num_layers <= 16, f"head.num_layers must be between 1 and 16, got {config.num_layers}")
    check(config.anchors >= 1, f"head.anchors must be >= 1, got {config.anchors}")
    check(config.gamma is None or config.gamma > 0, f"head.gamma must be > 0, got {config.gamma}")
    check(config.draft_vocab_size is None or config.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
    if config.target_layers is not None:
        check(len(config.target_layers) >= 1, "head.target_layers must list at least one target layer")
        # engines concatenate the layers in layer order: an unsorted list would permute fc's input columns
        check(list(config.target_layers) == sorted(set(config.target_layers)),
              f"head.target_layers must be different layers in increasing order, got {list(config.target_layers)}")
    if config.default_tree is not None:
        tree = parse_tree(config.default_tree, "head.default_tree")
        check(tree.depth <= config.depth, f"head.default_tree is {tree.depth} deep, but a block of "
                                          f"{config.block_size} drafts {config.depth} levels")


def resolve_block_settings(config, num_layers: int, vocab_size: int) -> None:
    """Fill a block drafter's values derived from the target (DFlash, DSpark) and check those that depend on it."""
    if config.target_layers is None:
        config.target_layers = default_target_layers(num_layers, config.num_layers)
    for layer in config.target_layers:
        check(0 <= layer < num_layers,
              f"head.target_layers: layer {layer} does not exist (the target has {num_layers} layers)")
    config.mask_token_id = resolve_mask_token(config.mask_token_id, vocab_size)
    check_draft_vocab(config.draft_vocab_size, vocab_size)
    if config.gamma is None:
        config.gamma = default_gamma(config.depth + 1)  # DFlash's γ at B = depth + 1 block positions
    if config.default_tree is None:
        config.default_tree = f"chain:{config.depth}"


def default_target_layers(num_target_layers: int, count: int) -> list[int]:
    """z-lab's choice: one layer in the middle, or `count` layers spread evenly from 1 to N-3 (rounded)."""
    if count == 1:
        return [num_target_layers // 2]
    start, end = 1, max(num_target_layers - 3, 2)
    layers = sorted({round(start + i * (end - start) / (count - 1)) for i in range(count)})
    return [min(layer, num_target_layers - 1) for layer in layers]


class DFlashDrafter(nn.Module):
    """fc + hidden_norm over the fused target layers, `num_layers` KV-injection layers over the block, a final norm,
    and the target's embedding and lm_head."""

    trains_target = False

    def __init__(self, config: DFlashConfig, target_config):
        super().__init__()
        dims = target_dims(target_config)
        hidden = dims.hidden_size
        self.config = config
        self.hidden_size, self.vocab_size = hidden, dims.vocab_size
        self.layer_config = layer_config = block_layer_config(target_config, config.num_layers)
        self.layers = nn.ModuleList(BlockLayer(layer_config) for _ in range(config.num_layers))
        self.fc = nn.Linear(len(config.target_layers) * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=layer_config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(hidden, eps=layer_config.rms_norm_eps)
        # the target's hidden_states[l + 1] is the output of layer l; KD also reads the last one (the lm_head input)
        last = (-1,) if self.reads_target_output() else ()
        self.feature_layers = tuple(layer + 1 for layer in config.target_layers) + last
        self.vocab = vocabulary(self, config.draft_vocab_size, dims.vocab_size)
        self.default_tree = parse_tree(config.default_tree)
        self.files = WeightsOnly(self)
        bind_frozen(self, _lm_head=None, _embed=None, _rotary=None)
        self.reset()

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    def draft_layers(self) -> list[nn.Module]:
        """The block layers head.init: target_layer copies the target's last layers into."""
        return list(self.layers)

    def fusion_inputs(self) -> list[tuple[nn.Linear, int]]:
        """fc and where the highest target layer's columns start (head.init: target_layer)."""
        return [(self.fc, (len(self.config.target_layers) - 1) * self.hidden_size)]

    def reads_target_output(self) -> bool:
        """Whether training reads the target's last hidden state too (its distributions: KD)."""
        return self.config.loss == "kd"

    def bind(self, target) -> "DFlashDrafter":
        """Share the target's frozen embedding, lm_head and rotary embedding (never trained or saved)."""
        rotary = LayerRotary(self.layer_config, Qwen3RotaryEmbedding, None)
        bind_parts(self, target, "DFlash", ("embed", "lm_head"), rotary=rotary)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ---- the forward ------------------------------------------------------------------------------------------

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, s, F] -> the context every layer reads [b, s, H]."""
        return self.hidden_norm(self.fc(features[..., : len(self.config.target_layers) * self.hidden_size]))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list:
        """Each layer's keys and values over the context [b, s, H] at positions [b or 1, s]."""
        cos_sin = self._cos_sin(context, positions)
        return [layer.context_kv(context, cos_sin) for layer in self.layers]

    def run_layers(self, tokens: torch.Tensor, positions: torch.Tensor, context_kv: list,
                   visible: torch.Tensor) -> torch.Tensor:
        """Block tokens [b, n] at positions [b, n] -> the normed output [b, n, H]."""
        h = self._bound("_embed")(tokens).to(self.dtype)
        cos_sin = self._cos_sin(h, positions)
        for layer, kv in zip(self.layers, context_kv):
            h = layer(h, cos_sin, kv, visible)
        return self.norm(h)

    def run_block(self, pending: torch.Tensor, start: int, context_kv: list) -> torch.Tensor:
        """One drafting forward: [pending, M, ..., M] at start.. after the cached context -> slots 1.. [b, B-1, H]."""
        return self.block_output(pending, start, context_kv)[:, 1:]

    def block_output(self, pending: torch.Tensor, start: int, context_kv: list) -> torch.Tensor:
        """[pending, M, ..., M] at start.. after the cached context -> every slot's output [b, B, H]."""
        b, block = pending.shape[0], self.config.block_size
        tokens = torch.full((b, block), self.config.mask_token_id, dtype=torch.long, device=pending.device)
        tokens[:, 0] = pending
        positions = torch.arange(start, start + block, device=pending.device)[None].expand(b, -1)
        visible = torch.ones(b, block, context_kv[0][0].shape[2] + block, dtype=torch.bool, device=pending.device)
        return self.run_layers(tokens, positions, context_kv, visible)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Output [..., H] -> fp32 logits through the target's lm_head: [..., V], or [..., Vd] (its rows for the
        draft vocabulary)."""
        return self.vocab.project(self._bound("_lm_head"), out)

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own logits from its last hidden state [..., H], over the same columns as draft_logits."""
        return self.vocab.project(self._bound("_lm_head"), features)

    def vocab_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Output [..., H] -> [..., V] over the target vocabulary (-inf outside a draft vocabulary)."""
        return self.vocab.widen(self.draft_logits(out))

    def _cos_sin(self, like: torch.Tensor, positions: torch.Tensor):
        if positions.shape[0] != like.shape[0]:
            positions = positions.expand(like.shape[0], -1)
        return self._bound("_rotary")(like, positions)

    def _bound(self, name: str) -> nn.Module:
        module = getattr(self, name)
        if module is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        return module

    # ---- training (core/drafter.py: TrainableDrafter) -------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Every anchored block of the batch in one forward (heads/parts/block_training.py)."""
        features, anchor, valid, out = self.anchored_blocks(batch)
        labels, counted = block_labels(batch, anchor, valid, self.config.block_size)
        final = features[..., -self.hidden_size:] if self.reads_target_output() else None
        return block_loss(self, out, anchor, labels, counted, final)

    def set_objective(self, objective: Objective) -> None:
        """train.depth_weights over the B - 1 drafted slots; a train.loss other than ce reads the target's
        distribution, which head.loss: kd makes training read."""
        if objective.loss not in (None, "ce") and not self.reads_target_output():
            raise DraftheadsError(f"train.loss {objective.loss} compares with the target's distribution, which DFlash "
                                  "reads with head.loss: kd; set head.loss: kd or train.loss: ce")
        take_objective(self, objective, self.config.block_size - 1)

    def anchored_blocks(self, batch: dict):
        """(features [b, s, F], anchor [b, A], valid [b, A], out [b, A, B, H]): up to `anchors` blocks per row, drawn
        at random, run in one forward, each seeing the context before its anchor and itself."""
        features = batch_features(batch, self.dtype)
        block = self.config.block_size
        anchor, valid = sample_anchors(batch, self.config.anchors, self.training)
        tokens, positions = block_inputs(batch, anchor, block, self.config.mask_token_id)
        b, count = anchor.shape
        context_positions = batch.get("position_ids")
        if context_positions is None:
            context_positions = torch.arange(features.shape[1], device=features.device)[None]
        context_kv = self.context_kv(self.context(features), context_positions)
        visible = block_visible(batch, anchor, valid, block)
        out = self.run_layers(tokens.view(b, -1), positions.view(b, -1), context_kv, visible)
        return features, anchor, valid, out.view(b, count, block, -1)

    param_groups = one_param_group

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first)."""
        self.vocab.choose(token_counts)

    # ---- drafting (core/drafter.py: Drafter), a generation's state in heads/parts/block_drafting.py ------

    reset, observe, propose = drafting_methods(BlockDrafting)
