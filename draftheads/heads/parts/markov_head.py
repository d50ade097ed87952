"""DSpark's two small heads on a block backbone (DeepSpec, deepspec/modeling/dspark/{markov_head,common}.py).

    Markov head      bias(prev) = W2 · W1[prev]: a rank-r logit bias conditioned on the token before a slot, added to
                     the slot's logits while the block is drafted left to right, so a slot's draft depends on the
                     token actually drafted before it (the block backbone alone marginalises over it)
    confidence head  c = w · [h; W1[prev]] + b: the logit of the chance that the slot's draft is accepted given that
                     everything before it was, trained against 1 - ½‖p - q‖₁ (BCE)

The weight names are DeepSpec's (`markov_head.markov_w1/markov_w2`, `confidence_head.proj`), so its layout is ours.
W1 is indexed by target token ids (the previous token may be any token); W2's rows are the drafter's columns (the
draft vocabulary's, when it has one). Both start as DeepSpec's do (transformers' normal init, std 0.02): the bias of an
untrained head is ~0.006 wide, so training starts from the backbone alone, and both factors get gradients at once.
"""

from __future__ import annotations

import torch
from torch import nn


class MarkovHead(nn.Module):
    """bias(prev ids [...]) -> [..., columns] fp32: W2 · W1[prev], rank `rank`."""

    def __init__(self, vocab_size: int, columns: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, columns, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.markov_w1.weight, std=0.02)  # transformers' initializer_range, as DeepSpec's post_init
        nn.init.normal_(self.markov_w2.weight, std=0.02)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """The rank-r code of each previous token [...] -> [..., r]."""
        return self.markov_w1(prev.long())

    def bias(self, prev: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.embed(prev)).float()


class MarkovBiased:
    """For a drafter whose `markov_head` is a MarkovHead or None (no bias: the slots drafted independently)."""

    markov_head: MarkovHead | None

    def markov_logits(self, base: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """A slot's logits [..., C] given the token before it [...]: base + the Markov bias."""
        return base if self.markov_head is None else base + self.markov_head.bias(prev)


class ConfidenceHead(nn.Module):
    """DeepSpec's AcceptRatePredictor: one linear map of [h; W1[prev]] (or h alone) to an acceptance logit."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1).float()
