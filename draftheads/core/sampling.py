"""Turning logits into the distribution we sample from, exactly as plain sampling does.

Every acceptance rule compares the *warped* target distribution p (temperature, then
top-k, then top-p, as transformers' sampling applies them) with the draft's q, so that
speculative output is distributed like plain sampling from the same target.
"""

from __future__ import annotations

import torch


def fold_seed(seed: int) -> int:
    """A seed that generators take: seeds derived layer on layer (a grown data folder's salt, times each writer's
    multiplier) can pass 2**63, which torch.Generator and servers' int64 seeds refuse; smaller ones stay as they are."""
    return seed % 2**63


def warp_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities after temperature, top-k and top-p.

    temperature 0 means greedy: a one-hot on the argmax.
    """
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(top1(logits), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop the low tail whose total mass is <= 1 - top_p; always keep the most likely token
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


# Draft probabilities below this are set to 0 before children are drawn. Once every likelier token of a node is
# drawn, its next child would be drawn among fp32 subnormals (q ~ 1e-45 at T=0.3 and a sharp draft), where
# multinomial and the strict rule's renormalisation of what is left round differently: a measured chi-square
# failure. At q = 0 such a child is a pad, which the rule's point-mass case handles exactly.
DRAW_FLOOR = 1e-20


def drawable(probs: torch.Tensor) -> torch.Tensor:
    """[..., V] probabilities -> the same with the values below DRAW_FLOOR zeroed, renormalised."""
    probs = probs.masked_fill(probs < DRAW_FLOOR, 0.0)
    return probs / probs.sum(-1, keepdim=True)


def top1(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] index of the largest value (the first one on ties), like argmax.

    On CPU, argmax over bf16 rows is several times slower than max().indices on a verify's [nodes, V]
    logits, and the greedy rule runs it every step.
    """
    return logits.max(-1).indices


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[..., V] -> [...] one token per distribution."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def pick_children(probs: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[b, V] -> [b, k] distinct tokens: the top-k, or (with a generator) k draws without replacement.

    Sampling without replacement draws sequentially: each next child from q renormalised over
    the tokens not yet drawn — the order the tree acceptance rule assumes.
    """
    if generator is None:
        return torch.topk(probs, k, dim=-1).indices
    k = min(k, int((probs > 0).sum(-1).min()))
    return torch.multinomial(probs.float(), k, replacement=False, generator=generator)
