"""P-EAGLE — "Parallel drafting EAGLE" (arXiv 2602.01469, 2026): EAGLE-3 drafting every depth in one forward.

    slot 0      EAGLE-3's input at the last committed position: fc([h_low; h_mid; h_high]) and the pending token
    slots 1..K-1  fc(mask_hidden) (a learned [3H] vector in place of the fused features) and the mask token, at the
                positions after it, causal among themselves
    all slots   -> the EAGLE-3 decoder layer over the cache of committed positions -> norm -> own lm_head
    slot d      drafts depth d + 1: K drafts for the price of one layer forward of K - 1 new positions

The layer, fc, norms, draft vocabulary and own lm_head are EAGLE-3's (heads/eagle3.py, which this class extends), so
a P-EAGLE folder is an EAGLE-3 folder plus `mask_hidden` and a mask token id (vLLM: method eagle3 with
parallel_drafting). The slots do not read the drafted tokens, so each depth's distribution is the same for every
node at that depth, as DFlash's (trees: heads/parts/block_drafting.py). Training (heads/parts/peagle_training.py)
replaces the training-time-test unroll by one pass over all depths with COD subsampling.

`head.markov_rank > 0` adds DSpark's fix for that (heads/parts/markov_head.py): a rank-r logit bias conditioned on
the token before each slot, trained on the real previous token, applied while the tree is drafted left to right
(heads/parts/markov_drafting.py). No engine runs it on P-EAGLE, so such a drafter exports only natively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree, parse_tree
from draftheads.heads.eagle3 import Eagle3Drafter, check_feature_layers, resolve_eagle3
from draftheads.heads.parts.block_drafting import tree_from_slots
from draftheads.heads.parts.common import resolve_mask_token
from draftheads.heads.parts.draft_layer import LayerDrafting
from draftheads.heads.parts.draft_tree import Sampling
from draftheads.heads.parts.layers import causal_visible
from draftheads.heads.parts.markov_drafting import markov_tree
from draftheads.heads.parts.markov_head import MarkovBiased, MarkovHead
from draftheads.heads.parts.peagle_training import parallel_set_objective, parallel_training_loss
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import drafting_methods

MAX_DEPTHS = 16


@dataclass
class PEagleConfig:
    """P-EAGLE hyper-parameters: EAGLE-3's, with the parallel depths and their COD subsampling instead of the
    training-time-test unroll."""

    type: Literal["peagle"] = doc("peagle", "head type")
    depths: int = doc(6, "tokens drafted per forward (vLLM's num_speculative_tokens): the anchor's slot and "
                         "depths - 1 mask slots")
    feature_layers: list[int] | None = doc(None, "the target layers whose OUTPUTS are fused (as head.type eagle3)")
    draft_vocab_size: int | None = doc(None, "its own lm_head drafts among this many most frequent target-generated "
                                             "tokens (default min(32000, target vocab))")
    mask_token_id: int | None = doc(None, "the token id of the mask slots: an existing row of the target's embedding "
                                          "(default: the last id of the vocabulary)")
    cod_ratio: float = doc(0.7, "COD subsampling: depth d trains on a share max(cod_ratio^d, cod_min) of the anchors "
                                "(each a subset of depth d-1's), so deep slots cost little memory")
    cod_min: float = doc(0.2, "COD subsampling: the smallest share of anchors any depth keeps")
    depth_decay: float = doc(1.0, "depth d's positions are weighted decay^d in the mean loss (1: every trained "
                                  "position alike, as speculators does; COD already trains fewer deep ones)")
    input_noise: float = doc(0.2, "width of the uniform noise added to input features during training (0 = off)")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:depths)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing P-EAGLE drafter (native or an engine layout)")
    markov_rank: int = doc(0, "rank of a DSpark-style Markov head, a logit bias W2 · W1[previous token] on every slot "
                              "(0: none, the slots drafted independently, what the engines load)")
    draft_layer: Literal["llama", "target"] | None = doc(None, "the draft layer's class, as head.type eagle3's "
                                                               "(default llama, what the engines load)")

    def __post_init__(self):
        check(1 <= self.depths <= MAX_DEPTHS, f"head.depths must be between 1 and {MAX_DEPTHS}, got {self.depths}")
        check(0 < self.cod_ratio <= 1, f"head.cod_ratio must be in (0, 1], got {self.cod_ratio}")
        check(0 < self.cod_min <= 1, f"head.cod_min must be in (0, 1], got {self.cod_min}")
        check(0 < self.depth_decay <= 1, f"head.depth_decay must be in (0, 1], got {self.depth_decay}")
        check(self.markov_rank >= 0, f"head.markov_rank must be >= 0 (0: no Markov head), got {self.markov_rank}")
        check(self.input_noise >= 0, f"head.input_noise must be >= 0, got {self.input_noise}")
        check(self.draft_vocab_size is None or self.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
        check_feature_layers(self.feature_layers)
        if self.default_tree is not None:
            tree = parse_tree(self.default_tree, "head.default_tree")
            check(tree.depth <= self.depths, f"head.default_tree is {tree.depth} deep, but P-EAGLE drafts "
                                             f"{self.depths} depths per forward (head.depths)")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        resolve_eagle3(self, num_layers, vocab_size)
        self.mask_token_id = resolve_mask_token(self.mask_token_id, vocab_size)
        if self.default_tree is None:
            self.default_tree = f"chain:{self.depths}"

    @property
    def depth(self) -> int:
        return self.depths


class ParallelDrafting(LayerDrafting):
    """EAGLE-3's cache of committed positions (observe is the same); propose runs the mask slots once."""

    @torch.no_grad()
    def propose(self, model: PEagleDrafter, tree: Tree | DynamicTreeSpec, sampling: Sampling):
        if self.root_out is None:
            raise DraftheadsError("P-EAGLE propose() called before observe(); feed the prompt's features first")
        if tree.depth > model.config.depths:
            raise DraftheadsError(f"tree depth {tree.depth} exceeds the {model.config.depths} depths P-EAGLE drafts "
                                  f"per forward; use a tree of depth <= {model.config.depths} or train a larger "
                                  "head.depths")
        slots = [model.draft_logits(self.root_out)[:, None]]  # depth 1: the anchor's own slot, already run
        if tree.depth > 1:  # causal slots: a shallower tree needs only the first ones
            slots.append(model.draft_logits(self.slot_outputs(model, tree.depth - 1)))
        base = torch.cat(slots, dim=1)  # [b, depth, C]: slot d drafts the children of every node at depth d
        if model.markov_head is not None:
            return markov_tree(model, tree, self.root_token, base, sampling)
        return tree_from_slots(tree, self.root_token, base, sampling, model.vocab)

    def slot_outputs(self, model: PEagleDrafter, count: int) -> torch.Tensor:
        """The layer's outputs [b, count, H] of mask slots 1..count after the committed positions (depths 2..)."""
        self.cache.truncate(self.committed)
        b, device = self.root_out.shape[0], self.root_out.device
        carry, tokens = model.mask_slots(b, count, device)
        # the root sits at the last committed position; mask slot d at d positions after it
        positions = torch.arange(self.committed, self.committed + count, device=device)[None]
        visible = causal_visible(None, 1, count, past=self.committed, device=device)
        out = model.forward_layer(carry, tokens, positions, visible, self.cache)
        self.cache.truncate(self.committed)
        return out


class PEagleDrafter(MarkovBiased, Eagle3Drafter):
    """EAGLE-3's layer and ends, a learned mask hidden vector, and drafting/training that make every depth in one
    pass; optionally a Markov head."""

    def __init__(self, config: PEagleConfig, target_config):
        super().__init__(config, target_config)
        # speculators and vLLM keep the mask vector before fc, [1, 1, 3H]; a unit-scale start like the features'
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, 3 * self.hidden_size))
        rank = config.markov_rank
        self.markov_head = MarkovHead(self.vocab_size, config.draft_vocab_size, rank) if rank else None

    def mask_slots(self, b: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(carry [b, n, H], tokens [b, n]) of n mask slots."""
        carry = self.fc(self.mask_hidden.to(self.dtype)).expand(b, n, -1)
        tokens = torch.full((b, n), self.config.mask_token_id, dtype=torch.long, device=device)
        return carry, tokens

    training_loss = parallel_training_loss  # every depth in one pass (heads/parts/peagle_training.py)
    set_objective = parallel_set_objective  # train.loss / train.depth_weights over its depths
    reset, observe, propose = drafting_methods(ParallelDrafting)  # heads/parts/protocol.py
