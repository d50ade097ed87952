"""How far a target moved: the old and the new target read the same rows (the drafter's own training rows), and at
every answer position their next-token distributions are compared.

    shift = target_shift(old_model, new_model, rows, limit=64)
    shift.agreement   # share of positions where both pick the same top-1 token
    shift.kl          # mean KL(old || new) in nats

A drafter was trained to predict the old target's tokens; where the new target's top-1 differs, a draft the old
target would have accepted is rejected. So `agreement` is the number that predicts the drop (drift/drift.py):
each accepted depth survives with about that probability. KL says how much the distributions moved beyond their
top-1; `new_accuracy` is the new target's top-1 agreement with the tokens of the rows themselves (the old target's
own outputs, so `old_accuracy` is 1 up to the dtype's rounding).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from draftheads.core.errors import DraftheadsError

@dataclass
class Shift:
    rows: int
    positions: int
    agreement: float
    kl: float
    old_accuracy: float
    new_accuracy: float

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def target_shift(old, new, rows, limit: int = 64, max_length: int = 512) -> Shift:
    """Compare `old` and `new` (two causal LMs with one vocabulary) on the first `limit` rows' answer positions."""
    picked = list(range(min(limit, len(rows))))
    same = positions = 0
    kl = old_right = new_right = 0.0
    for index in picked:   # one row at a time: no padding to keep out of either model's attention
        row = rows[index]
        ids, mask = np.asarray(row["input_ids"][:max_length]), np.asarray(row["loss_mask"][:max_length])
        # position i predicts token i + 1: the positions whose next token is part of an answer
        where = torch.as_tensor(np.flatnonzero(mask[1:] > 0))
        if len(where) == 0:
            continue
        tokens = torch.as_tensor(ids, dtype=torch.long)[None]
        old_logp = next_token_logprobs(old, tokens, where)
        new_logp = next_token_logprobs(new, tokens, where)
        truth = torch.as_tensor(ids[1:], dtype=torch.long)[where]
        same += int((old_logp.argmax(-1) == new_logp.argmax(-1)).sum())
        old_right += int((old_logp.argmax(-1) == truth).sum())
        new_right += int((new_logp.argmax(-1) == truth).sum())
        kl += float((old_logp.exp() * (old_logp - new_logp)).sum())
        positions += len(where)
    if not positions:   # an agreement over nothing would predict a tau from nothing
        raise DraftheadsError(f"the first {len(picked)} of {len(rows)} rows hold no answer tokens to compare the "
                              "targets on; give more --rows, or --data a `draftheads data` folder the old target "
                              "answered in")
    n = positions
    return Shift(rows=len(picked), positions=positions, agreement=same / n, kl=kl / n, old_accuracy=old_right / n,
                 new_accuracy=new_right / n)


def next_token_logprobs(model, tokens: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """[n, V] fp32 log-probabilities of the next token at positions `where` of the one row `tokens`."""
    logits = model(input_ids=tokens.to(model.device)).logits[0, where.to(model.device)]
    vocab = min(logits.shape[-1], model.config.vocab_size)   # padded lm_heads: compare real tokens only
    return torch.log_softmax(logits[:, :vocab].float().cpu(), dim=-1)
