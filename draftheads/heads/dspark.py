"""DSpark — DFlash with a semi-autoregressive correction (DeepSeek, deepseek-ai/DeepSpec, 2026).

    backbone     DFlash's (heads/dflash.py): fc + hidden_norm over the fused target layers, KV-injection layers over
                 the block [x_a, M, ..., M], norm, the target's lm_head; every slot drafts: slot j -> x_{a+j+1}
    Markov head  a rank-r logit bias W2 · W1[previous token] on each slot (heads/parts/markov_head.py), applied
                 while the block is drafted left to right: slot j's draft depends on the token drafted before it
    confidence   a linear map of [h_j; W1[previous token]] to the chance slot j is accepted once its prefix is;
                 `head.verify: scheduled` verifies only the prefix of a chain that pays for its verify time

Each block slot of a block-parallel drafter predicts its token without the one drafted before it, so deep slots
marginalise over their predecessors and lose acceptance along the block; the Markov head gives the slot its
predecessor back at the cost of one rank-r product per draft. Training (heads/parts/dspark_training.py) is DFlash's
anchored blocks with DeepSpec's loss (CE + L1 to the target's distribution + BCE for the confidence); drafting
(heads/parts/dspark_drafting.py): chains, static trees and DDTree dynamic trees, each node's children drawn from the
distribution given its own token, so greedy, strict and typical acceptance stay exact.

DeepSpec trains 7 drafts per block (config/dspark: block_size 7, 5 layers, rank 256, gamma 4, 0.1 CE + 0.9 L1 + 1.0
confidence); the weight names are its own (layers.*, fc, hidden_norm, norm, markov_head.*, confidence_head.proj).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.heads.dflash import DFlashDrafter, check_block_settings, resolve_block_settings
from draftheads.heads.parts.dspark_drafting import DSparkDrafting, VerifyCosts
from draftheads.heads.parts.dspark_training import dspark_labels, dspark_loss
from draftheads.heads.parts.markov_head import ConfidenceHead, MarkovBiased, MarkovHead
from draftheads.heads.parts.objective import HEAD_OWN, Objective
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import drafting_methods


@dataclass
class DSparkConfig:
    """DSpark hyper-parameters (hidden size, vocabulary, attention and MLP sizes come from the target)."""

    type: Literal["dspark"] = doc("dspark", "head type")
    block_size: int = doc(7, "drafts per forward: the block [pending, M, ..., M] has block_size positions, each "
                             "drafting the token after it (DeepSpec's 7)")
    num_layers: int = doc(1, "draft decoder layers (Qwen3-style, the target's sizes)")
    target_layers: list[int] | None = doc(None, "the target layers whose OUTPUTS form the context, in increasing "
                                                "order (as head.type dflash; default: num_layers layers spread from 1 "
                                                "to N-3, or N//2 for one layer)")
    mask_token_id: int | None = doc(None, "the token id of the block's mask slots: an existing row of the target's "
                                          "embedding (default: the last id of the vocabulary)")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens, "
                                             "through the target lm_head's rows for them (default: all)")
    anchors: int = doc(32, "blocks trained per row and step, anchored at random counted positions")
    markov_rank: int = doc(256, "rank of the Markov head's bias W2 · W1[previous token] (0: no Markov head, the "
                                "slots drafted independently as DFlash's)")
    confidence: bool = doc(True, "train the confidence head (the acceptance of each slot, for scheduled verification)")
    confidence_with_markov: bool = doc(True, "the confidence head reads the previous token's Markov code beside the "
                                             "slot's hidden state (needs markov_rank > 0)")
    gamma: float | None = doc(None, "slot j's loss weight is exp(-j/gamma) (default 4 at 7 drafts, as DeepSpec)")
    ce_weight: float = doc(0.1, "weight of the cross-entropy on the target's tokens (DeepSpec's ce_loss_alpha)")
    l1_weight: float = doc(0.9, "weight of ‖p - q‖₁ to the target's distribution (DeepSpec's l1_loss_alpha)")
    confidence_weight: float = doc(1.0, "weight of the confidence head's BCE (DeepSpec's confidence_head_alpha)")
    verify: Literal["all", "scheduled"] = doc("all", "all: verify every drafted node; scheduled: cut a chain where "
                                                     "its confidence no longer pays for the verify time measured on "
                                                     "this machine (draftheads eval prices it from the cost profile)")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:block_size)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing drafter (native layout)")

    def __post_init__(self):
        check_block_settings(self)
        check(self.markov_rank >= 0, f"head.markov_rank must be >= 0 (0: no Markov head), got {self.markov_rank}")
        check(min(self.ce_weight, self.l1_weight, self.confidence_weight) >= 0 and self.ce_weight + self.l1_weight > 0,
              "head.ce_weight, head.l1_weight and head.confidence_weight must be >= 0, and ce_weight + l1_weight > 0")
        check(not (self.confidence and self.confidence_with_markov and self.markov_rank == 0),
              "head.confidence_with_markov needs a Markov head: set head.markov_rank > 0 or "
              "head.confidence_with_markov: false")
        check(self.verify == "all" or self.confidence, "head.verify: scheduled needs the confidence head; set "
                                                       "head.confidence: true")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        resolve_block_settings(self, num_layers, vocab_size)

    @property
    def depth(self) -> int:
        return self.block_size


class DSparkDrafter(MarkovBiased, DFlashDrafter):
    """DFlash's backbone, every slot drafting, plus the Markov and confidence heads."""

    def __init__(self, config: DSparkConfig, target_config):
        super().__init__(config, target_config)
        columns = config.draft_vocab_size or self.vocab_size
        rank = config.markov_rank
        self.markov_head = MarkovHead(self.vocab_size, columns, rank) if rank else None
        width = self.hidden_size + (rank if config.confidence_with_markov else 0)
        self.confidence_head = ConfidenceHead(width) if config.confidence else None
        self.verify_costs: VerifyCosts | None = None  # set_verify_costs, for head.verify: scheduled

    def reads_target_output(self) -> bool:
        return True  # L1 and the confidence target compare with the target's distribution

    def run_block(self, pending: torch.Tensor, start: int, context_kv: list) -> torch.Tensor:
        """One drafting forward: every slot of [pending, M, ..., M] drafts, [b, B, H]."""
        return self.block_output(pending, start, context_kv)

    def slot_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_logits(self.draft_logits(hidden), prev)

    def confidence_logits(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """The logit of each slot's acceptance given its prefix's, from its output [..., H] and previous token [...]."""
        if self.config.confidence_with_markov:
            hidden = torch.cat([hidden, self.markov_head.embed(prev).to(hidden.dtype)], dim=-1)
        return self.confidence_head(hidden.to(self.confidence_head.proj.weight.dtype))

    def full_target_logits(self, final: torch.Tensor) -> torch.Tensor:
        """The target's logits over its whole vocabulary from its last hidden states [..., H] (fp32)."""
        lm_head = self._bound("_lm_head")
        return lm_head(final.to(lm_head.weight.dtype)).float()

    def to_columns(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V] over target ids -> [..., C] the drafter's columns (the draft vocabulary's, or all)."""
        return probs[..., self.vocab.ids.to(probs.device)] if self.vocab.restricted else probs

    def set_verify_costs(self, costs: VerifyCosts | None) -> None:
        """The draft and verify times `head.verify: scheduled` weighs each draft's confidence against."""
        self.verify_costs = costs if self.config.verify == "scheduled" else None

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Every anchored block of the batch in one forward, DeepSpec's loss (heads/parts/dspark_training.py)."""
        features, anchor, valid, out = self.anchored_blocks(batch)
        labels, counted, prev = dspark_labels(batch, anchor, valid, self.config.block_size)
        return dspark_loss(self, out, anchor, labels, counted, prev, features[..., -self.hidden_size:])

    def set_objective(self, objective: Objective) -> None:
        """DSpark trains with DeepSpec's own mix (head.ce_weight, l1_weight, confidence_weight, gamma)."""
        if objective != HEAD_OWN:
            raise DraftheadsError("DSpark trains with its own CE + L1 + confidence mix, weighted by head.gamma; leave "
                                  "train.loss and train.depth_weights unset and set head.ce_weight / l1_weight / "
                                  "confidence_weight / gamma instead")
        self.objective = objective

    reset, observe, propose = drafting_methods(DSparkDrafting)
