"""Training DSpark: DFlash's anchored blocks (heads/parts/block_training.py), every slot a draft, DeepSpec's loss.

Slots are DeepSpec's, not z-lab's: the block [x_a, M, ..., M] at positions a..a+B-1 drafts from every slot, slot j
predicting x_{a+j+1} (as the target's own position a+j does), so a block of B positions drafts B tokens. A slot
counts while every slot before it does (DeepSpec's eval mask is a cumulative product: a draft after an uncounted
one is never verified). Slot j's previous token, which the Markov head and the confidence head read, is the real
x_{a+j} (the anchor's token for slot 0): teacher forcing, as DeepSpec trains them.

The loss, read from DeepSpec's deepspec/modeling/dspark/loss.py and config/dspark/*.py (defaults theirs):

    w_j   = exp(-j / gamma)                              gamma 4 at 7 drafts, as DFlash's at 8 positions
    CE    = Σ w_j · CE(logits_j, x_{a+j+1}) / Σ w_j       on the logits with the Markov bias
    L1    = Σ w_j · ‖p_j - q_j‖₁ / Σ w_j                 p the draft's distribution, q the target's at a+j
    conf  = Σ w_j · BCE(c_j, 1 - ½‖p_j - q_j‖₁) / Σ w_j  the acceptance a strict verifier gives slot j (detached)
    loss  = ce_weight · CE + l1_weight · L1 + confidence_weight · conf        (0.1, 0.9, 1.0)

With a draft vocabulary, p is zero outside it and q is the target's full distribution: the target's mass outside
counts whole in ‖p - q‖₁ (it is what a strict verifier rejects). DeepSpec normalises each term by its own weight sum
over all ranks; we do so per batch, as the other heads do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftheads.heads.parts.block_training import block_labels
from draftheads.heads.parts.common import DepthMetrics
from draftheads.heads.parts.draft_vocab import IGNORE

TARGET_CHUNK = 512  # rows of the target's full-vocabulary softmax held at once (49k columns: 100 MB in fp32)


def draft_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B] loss weight of slots 0..B-1: exp(-j / gamma)."""
    return torch.exp(-torch.arange(block_size, device=device, dtype=torch.float32) / gamma)


def dspark_labels(batch: dict, anchor: torch.Tensor, valid: torch.Tensor, block_size: int):
    """(labels, counted, prev), each [b, A, B]: slot j's label x_{a+j+1}, whether it counts (it and every slot before
    it), and the token before it x_{a+j}."""
    labels, counted = block_labels(batch, anchor, valid, block_size + 1)
    first = batch["input_ids"].gather(1, anchor)
    prev = torch.cat([first[..., None], labels[..., 1:-1]], dim=-1)
    counted = counted[..., 1:].long().cumprod(-1).bool()
    return labels[..., 1:], counted, prev


@torch.no_grad()
def target_distribution(model, final: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's distribution from its last hidden states [n, H]: (q over the drafter's columns [n, C], the mass
    it puts outside them [n]), computed in chunks so the full-vocabulary softmax never exists for every row at once."""
    columns, outside = [], []
    for part in final.split(TARGET_CHUNK):
        full = model.full_target_logits(part).softmax(-1)
        inside = model.to_columns(full)
        columns.append(inside)
        outside.append((1.0 - inside.sum(-1)).clamp(min=0.0))
    return torch.cat(columns), torch.cat(outside)


def dspark_loss(model, out: torch.Tensor, anchor: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor,
                prev: torch.Tensor, final: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """DeepSpec's loss over every counted slot, and per-slot metrics (top-1 of the Markov-corrected logits given the
    real previous token: the greedy acceptance of a slot whose prefix was accepted). out [b, A, B, H] is the
    backbone's output, final [b, s, H] the target's last hidden state."""
    config = model.config
    block_size = out.shape[2]
    metrics = DepthMetrics(block_size, out.device)
    rows, blocks, slots = torch.nonzero(counted, as_tuple=True)
    if rows.numel() == 0:
        return out.sum() * 0.0, metrics.as_dict()  # keeps every parameter in the graph (DDP)
    hidden, target, before = out[rows, blocks, slots], labels[rows, blocks, slots], prev[rows, blocks, slots]
    weights = draft_weights(block_size, config.gamma, out.device)[slots]
    logits = model.slot_logits(hidden, before)
    q, outside = target_distribution(model, final[rows, anchor[rows, blocks] + slots])
    ce = F.cross_entropy(logits, model.vocab.labels(target), ignore_index=IGNORE, reduction="none")
    l1 = (logits.softmax(-1) - q).abs().sum(-1) + outside
    per_token = config.ce_weight * ce + config.l1_weight * l1
    if model.confidence_head is not None:
        accept = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)
        confidence = model.confidence_logits(hidden, before)
        per_token = per_token + config.confidence_weight * F.binary_cross_entropy_with_logits(
            confidence, accept, reduction="none")
    loss = (weights * per_token).sum() / weights.sum()
    hits = model.vocab.to_target(logits.argmax(-1)) == target
    for j in range(block_size):
        at = slots == j
        metrics.add(j, per_token[at].sum(), hits[at].sum(), int(at.sum()))
    return loss, metrics.as_dict()
