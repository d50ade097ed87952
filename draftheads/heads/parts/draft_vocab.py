"""A draft vocabulary: the subset of the target's tokens a drafter may propose.

Drafting over the target's whole vocabulary costs one [n, H] x [H, V] product per draft step; on a
CPU with a vocabulary of tens of thousands of tokens that costs more than the draft layer itself.
The few thousand tokens the target generates most often cover nearly all of its answers, and their
rows of the lm_head stay in cache, an order of magnitude cheaper. A drafter keeps the choice in two
buffers, registered on the drafter itself in the layout EAGLE-3 engines read:

    d2t [Vd]  target id of draft entry i = i + d2t[i]
    t2d [V]   bool, True for tokens in the draft vocabulary

Every drafter holds a vocabulary component, `drafter.vocab`: a `DraftVocabulary` over those buffers,
or `FullVocabulary` when it drafts over every token. Both answer the same questions (how draft
columns map to target ids, how to widen draft logits to the target vocabulary, how to project
hidden states through the target's lm_head), so the heads never branch on which one they hold.
Heads whose output layer is the target's own frozen lm_head (EAGLE-1/2, MTP, shared Medusa) draft
with its rows for the chosen tokens: no new weights, so the choice can be made after training too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.core.errors import DraftheadsError

IGNORE = -100  # cross_entropy's ignore_index: labels outside the draft vocabulary


def check_draft_vocab(size: int | None, vocab_size: int) -> None:
    """head.draft_vocab_size against the target's vocabulary (None: the full vocabulary)."""
    if size is not None and not 0 < size <= vocab_size:
        raise DraftheadsError(f"head.draft_vocab_size must be between 1 and the target vocabulary ({vocab_size}), "
                              f"got {size}")


def ids(d2t: torch.Tensor) -> torch.Tensor:
    """[Vd] target token id of each draft-vocabulary entry."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


def members(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """t2d for a d2t: [V] bool, True for the target ids the draft vocabulary holds."""
    return torch.zeros(vocab_size, dtype=torch.bool, device=d2t.device).index_fill(0, ids(d2t), True)


def scatter(values: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """[..., Vd] -> [..., V]: each column at its target id, `fill` everywhere else."""
    full = values.new_full((*values.shape[:-1], vocab_size), fill)
    return full.index_copy(-1, draft_ids.to(values.device), values)


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


class DraftVocabulary:
    """The draft vocabulary of `owner`, whose d2t/t2d buffers it registers (at first: ids 0..size-1).

    The buffers stay the owner's (they move, cast and save with it, under the names engines read);
    this component only reads them."""

    restricted = True

    def __init__(self, owner: nn.Module, size: int, vocab_size: int):
        check_draft_vocab(size, vocab_size)
        owner.register_buffer("d2t", torch.zeros(size, dtype=torch.long))
        owner.register_buffer("t2d", torch.arange(vocab_size) < size)
        self._owner, self.size, self.vocab_size = owner, size, vocab_size
        self._rows = SharedRows()

    @property
    def d2t(self) -> torch.Tensor:
        return self._owner.d2t

    @property
    def ids(self) -> torch.Tensor:
        """[Vd] target token id of each draft-vocabulary entry."""
        return ids(self.d2t)

    def to_target(self, picked: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices (any shape) -> target token ids."""
        return self.ids.to(picked.device)[picked]

    def labels(self, targets: torch.Tensor) -> torch.Tensor:
        """Target ids [n] -> draft indices [n], IGNORE for tokens outside the draft vocabulary."""
        sorted_ids, entry = self.ids.to(targets.device).sort()
        at = torch.searchsorted(sorted_ids, targets).clamp(max=len(sorted_ids) - 1)
        return torch.where(sorted_ids[at] == targets, entry[at], torch.full_like(targets, IGNORE))

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., Vd] -> [..., V], -inf outside the draft vocabulary."""
        return scatter(logits, self.ids, self.vocab_size, float("-inf"))

    def widen_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft probabilities [..., Vd] -> [..., V], zero outside the draft vocabulary."""
        return scatter(probs, self.ids, self.vocab_size, 0.0)

    def project(self, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> [..., Vd] fp32 logits through lm_head's rows for the draft vocabulary
        (softmax over them is lm_head's distribution restricted to it)."""
        weight, bias = self._rows(lm_head, self.d2t)
        return F.linear(hidden.to(weight.dtype), weight, bias).float()

    @torch.no_grad()
    def choose(self, token_counts: torch.Tensor) -> torch.Tensor:
        """Fill d2t/t2d with the `size` most frequent tokens (ties: lower id first); returns their ids.

        token_counts [V]: how often each token is a loss-masked (target-generated) token.
        """
        if token_counts.shape != (self.vocab_size,):
            raise DraftheadsError(f"token counts must have one entry per target token ({self.vocab_size}), "
                                  f"got {tuple(token_counts.shape)}")
        order = torch.sort(-token_counts.long().cpu(), stable=True).indices  # stable: ties keep id order
        d2t, t2d = self._owner.d2t, self._owner.t2d
        chosen = order[: self.size].sort().values.to(d2t.device)
        d2t.copy_(chosen - torch.arange(self.size, device=chosen.device))
        t2d.zero_()
        t2d[chosen] = True
        return chosen


class FullVocabulary:
    """Drafting over every target token: draft columns are target ids, so every mapping is the identity."""

    restricted = False

    def to_target(self, picked: torch.Tensor) -> torch.Tensor:
        return picked

    def labels(self, targets: torch.Tensor) -> torch.Tensor:
        return targets

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def widen_probs(self, probs: torch.Tensor) -> torch.Tensor:
        return probs

    def project(self, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> [..., V] fp32 logits of lm_head."""
        return lm_head(hidden.to(lm_head.weight.dtype)).float()

    def choose(self, token_counts: torch.Tensor) -> torch.Tensor:
        raise DraftheadsError("this drafter drafts over the full vocabulary; set head.draft_vocab_size to give it a "
                              "draft vocabulary")


FULL = FullVocabulary()


def vocabulary(owner: nn.Module, size: int | None, vocab_size: int) -> DraftVocabulary | FullVocabulary:
    """The vocabulary component for a drafter: a draft vocabulary of `size` tokens, or the full one."""
    return FULL if size is None else DraftVocabulary(owner, size, vocab_size)
