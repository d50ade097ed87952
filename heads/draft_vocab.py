"""A draft vocabulary: the subset of the target's tokens a drafter may propose.

Drafting over the target's whole vocabulary costs one [n, H] x [H, V] product per draft step; on a
CPU with SmolLM2 (V = 49,152) that is 5.2 ms for 8 rows in bf16, more than the draft layer itself.
The 8,192 tokens the target generates most often cover >99% of its answers, and their rows of
the lm_head (9 MiB) stay in cache: 0.4 ms. A drafter keeps the choice in two buffers, in the
layout EAGLE-3 engines read:

    d2t [Vd]  target id of draft entry i = i + d2t[i]
    t2d [V]   bool, True for tokens in the draft vocabulary

Heads whose output layer is the target's own frozen lm_head (EAGLE-1/2, MTP) draft with its rows
for those tokens (`SharedRows`): no new weights, so the choice can be made after training too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.errors import DraftheadsError
from draftheads.heads.draft_tree import Columns

IGNORE = -100  # cross_entropy's ignore_index: labels outside the draft vocabulary


def add_buffers(module: nn.Module, size: int, vocab_size: int) -> None:
    """Register d2t/t2d on `module` for a draft vocabulary of `size` tokens (at first: ids 0..size-1)."""
    if not 0 < size <= vocab_size:
        raise DraftheadsError(f"head.draft_vocab_size must be between 1 and the target vocabulary ({vocab_size}), got {size}")
    module.register_buffer("d2t", torch.zeros(size, dtype=torch.long))
    module.register_buffer("t2d", torch.arange(vocab_size) < size)


def ids(d2t: torch.Tensor) -> torch.Tensor:
    """[Vd] target token id of each draft-vocabulary entry."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


@torch.no_grad()
def choose(module: nn.Module, token_counts: torch.Tensor) -> torch.Tensor:
    """Fill module.d2t/t2d with the most frequent tokens (ties: lower id first); returns their ids.

    token_counts [V]: how often each token is a loss-masked (target-generated) token.
    """
    vocab, size = len(module.t2d), len(module.d2t)
    if token_counts.shape != (vocab,):
        raise DraftheadsError(f"token counts must have one entry per target token ({vocab}), got {tuple(token_counts.shape)}")
    order = torch.sort(-token_counts.long().cpu(), stable=True).indices  # stable: ties keep id order
    chosen = order[:size].sort().values.to(module.d2t.device)
    module.d2t.copy_(chosen - torch.arange(size, device=chosen.device))
    module.t2d.zero_()
    module.t2d[chosen] = True
    return chosen


def members(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """t2d for a d2t: [V] bool, True for the target ids the draft vocabulary holds."""
    return torch.zeros(vocab_size, dtype=torch.bool, device=d2t.device).index_fill(0, ids(d2t), True)


def scatter(values: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """[..., Vd] -> [..., V]: each column at its target id, `fill` everywhere else."""
    full = values.new_full((*values.shape[:-1], vocab_size), fill)
    return full.index_copy(-1, draft_ids.to(values.device), values)


def widen(logits: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., Vd] -> [..., V], -inf outside the draft vocabulary."""
    return scatter(logits, ids(d2t), vocab_size, float("-inf"))


def draft_labels(labels: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Target ids [n] -> draft ids [n], IGNORE for tokens outside the draft vocabulary."""
    sorted_ids, entry = ids(d2t).to(labels.device).sort()
    at = torch.searchsorted(sorted_ids, labels).clamp(max=len(sorted_ids) - 1)
    return torch.where(sorted_ids[at] == labels, entry[at], torch.full_like(labels, IGNORE))


class SharedRows:
    """The target lm_head's rows for a draft vocabulary, gathered once and again only when the
    vocabulary (d2t changed in place or reloaded) or the lm_head (moved, cast) changes."""

    def __init__(self):
        self._key, self._rows = None, None

    def __call__(self, lm_head: nn.Module, d2t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
        key = (d2t._version, d2t.data_ptr(), weight.data_ptr(), weight.dtype, weight.device)
        if key != self._key:
            rows = ids(d2t).to(weight.device)
            self._key, self._rows = key, (weight[rows].contiguous(), bias[rows] if bias is not None else None)
        return self._rows

    def logits(self, lm_head: nn.Module, d2t: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> [..., Vd] draft-vocabulary logits, fp32."""
        weight, bias = self(lm_head, d2t)
        return F.linear(hidden.to(weight.dtype), weight, bias).float()


class DraftVocabulary:
    """Mixin for drafters with an optional draft vocabulary: `config.draft_vocab_size` set, buffers from
    `add_buffers`. Everything a head asks about it, in one place."""

    @property
    def has_draft_vocab(self) -> bool:
        return self.config.draft_vocab_size is not None

    @property
    def draft_ids(self) -> torch.Tensor:
        """[Vd] target token id of each draft-vocabulary entry."""
        return ids(self.d2t)

    @property
    def draft_map(self) -> torch.Tensor | None:
        """d2t for `masked_ce`, None when drafting over the full vocabulary."""
        return self.d2t if self.has_draft_vocab else None

    def draft_columns(self) -> Columns | None:
        """What the columns of draft-space logits are, for `draft_static` / `draft_dynamic`."""
        return Columns(self.draft_ids, len(self.t2d)) if self.has_draft_vocab else None

    def widen_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-space logits [..., Vd] -> [..., V] (-inf outside); full-vocabulary logits unchanged."""
        return widen(logits, self.d2t, len(self.t2d)) if self.has_draft_vocab else logits

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own logits from its final features [..., H] (after its last norm), fp32: over the
        draft vocabulary's columns when there is one (softmax over them is the target's distribution
        restricted to it), else over the whole vocabulary."""
        if getattr(self, "_lm_head", None) is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        if self.has_draft_vocab:
            return self._shared_rows.logits(self._lm_head, self.d2t, features)
        return self._lm_head(features.to(self._lm_head.weight.dtype)).float()

    def set_draft_vocab(self, token_counts: torch.Tensor) -> torch.Tensor:
        """Draft among the draft_vocab_size tokens most frequent in `token_counts` [V]; returns their ids."""
        if not self.has_draft_vocab:
            raise DraftheadsError("this drafter drafts over the full vocabulary; set head.draft_vocab_size to give it a draft vocabulary")
        return choose(self, token_counts)
