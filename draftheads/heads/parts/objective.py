"""What a drafter's training minimises, chosen by the recipe's `train.loss` and `train.depth_weights`: the loss of one
draft token against the target, and how the depths (unroll steps, heads, modules, block slots) are weighted.

Token losses, with p the target's distribution of the token and q the drafter's, over the drafter's columns:

    kl         -Σ p log q           forward KL up to the target's entropy (a constant): the soft cross-entropy
    ce         -log q(x)            cross-entropy on the token the target generated
    rkl        Σ q log(q / p)       reverse KL: mode-seeking
    jsd        ½ KL(p‖m) + ½ KL(q‖m), m = (p + q) / 2
    tv         ½ Σ |p - q| = 1 - α  where α = Σ min(p, q) is the chance a sampled draft is accepted
    lk_alpha   -log α               LK (arXiv 2602.23881): TV's direction, its gradient scaled by 1/α
    lk_lambda  λ KL + (1 - λ) TV    LK's adaptive mix, λ = exp(-3 sg[α]) per position: KL's strong gradient while
                                    α is low, acceptance itself once it is high

With a draft vocabulary (heads/parts/draft_vocab.py), p is the target's distribution renormalised over it, as the
soft cross-entropy always had it: the drafter cannot put mass outside, q = p̃ maximises Σ_D min(p, q) = P(token in
D) exactly as the unrenormalised p would, and the losses then measure acceptance given that the target's token is
drafted at all (the share outside is counted by the top-1 metric as misses). α is computed in log space,
logsumexp(min(log p, log q)), so lk_alpha stays finite when the supports hardly overlap.

Depth weights (`train.depth_weights`): the head's own schedule by default (ttt_decay^j, loss_decay^k, step_decay^k,
DFlash's exp(-(k-1)/γ)); `uniform`; `fastmtp` (0.6^(k-1), FastMTP: 0.51 / 0.31 / 0.18 at 3 depths); `dflash`
(exp(-(k-1)/γ), γ = 4 at 7 depths, DFlash's line); `reach` (depth k weighted by the chance it is reached, the
product of the batch's top-1 accuracies at depths 1..k-1, so each depth counts as much as it adds to the expected
accepted length); or a list of one weight per depth. Chosen weights are scaled to the sum of the head's own, so a
change of shape keeps the loss's scale and the learning rate means the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts.draft_vocab import IGNORE

# The names train.loss and train.depth_weights accept (TrainConfig's types are these)
Loss = Literal["kl", "ce", "rkl", "jsd", "tv", "lk_alpha", "lk_lambda"]
DepthSchedule = Literal["uniform", "fastmtp", "dflash", "reach"]
LOSSES, DEPTH_SCHEDULES = get_args(Loss), get_args(DepthSchedule)
LK_ETA = 3.0  # LK-lambda's λ = exp(-η α): the paper's and speculators' η


@dataclass(frozen=True)
class Objective:
    """train.loss (None: the head's own) and train.depth_weights (None: the head's own schedule)."""

    loss: str | None = None
    depth_weights: str | tuple[float, ...] | None = None

    def loss_for(self, head_default: str) -> str:
        return self.loss or head_default


HEAD_OWN = Objective()


def objective_of(drafter) -> Objective:
    """The objective training attached to `drafter` (training/setup.py), or the head's own."""
    return getattr(drafter, "objective", HEAD_OWN)


def attach_objective(drafter, loss: str | None, weights) -> None:
    """Give `drafter` the recipe's train.loss and train.depth_weights: each head's `set_objective` checks what it
    can train with and refuses the rest in one line; a head without one trains with its own loss only."""
    objective = Objective(loss, tuple(weights) if isinstance(weights, list) else weights)
    if hasattr(drafter, "set_objective"):
        drafter.set_objective(objective)
    elif objective != HEAD_OWN:
        raise DraftheadsError(f"head.type {drafter.config.type} trains with its own loss; leave train.loss and "
                              "train.depth_weights unset")


def take_objective(model, objective: Objective, depths: int) -> None:
    """What a head's `set_objective` does when it takes any train.loss: check train.depth_weights against its `depths`
    and keep the objective on `model`."""
    check_depth_weights(objective.depth_weights, depths)
    model.objective = objective


# ---- token losses ----------------------------------------------------------------------------------------------


def token_loss(kind: str, logits: torch.Tensor, target_log_p: torch.Tensor | None,
               labels: torch.Tensor | None = None) -> torch.Tensor:
    """[n] loss of each row: draft logits [n, C] against the target's log-distribution [n, C] over the same columns
    (no gradient), or for `ce` against labels [n] (column ids, IGNORE where the token is not a column: no loss)."""
    logits = logits.float()
    if kind == "ce":
        return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="none")
    log_q = logits.log_softmax(-1)
    log_p = target_log_p.float().detach()
    p = log_p.exp()
    if kind == "kl":
        return -(p * log_q).sum(-1)
    q = log_q.exp()
    if kind == "rkl":
        return (q * (log_q - log_p)).sum(-1)
    if kind == "jsd":
        log_m = torch.logaddexp(log_p, log_q) - math.log(2.0)
        return 0.5 * ((p * (log_p - log_m)).sum(-1) + (q * (log_q - log_m)).sum(-1))
    if kind == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    log_alpha = torch.minimum(log_p, log_q).logsumexp(-1)
    if kind == "lk_alpha":
        return -log_alpha
    if kind == "lk_lambda":
        lam = torch.exp(-LK_ETA * log_alpha.detach().exp())
        kl = (p * (log_p - log_q)).sum(-1)
        return lam * kl + (1.0 - lam) * 0.5 * (p - q).abs().sum(-1)
    raise DraftheadsError(f"train.loss must be one of {', '.join(LOSSES)}, got {kind!r}")


def acceptance(logits: torch.Tensor, target_log_p: torch.Tensor) -> torch.Tensor:
    """[n] α = Σ min(p, q): the chance a token sampled from the draft is accepted by strict verification."""
    return torch.minimum(target_log_p.float(), logits.float().log_softmax(-1)).logsumexp(-1).exp()


# ---- depth weights ----------------------------------------------------------------------------------------------


def check_depth_weights(value, depths: int | None = None) -> None:
    """train.depth_weights: a schedule's name or one non-negative weight per depth (`depths`, when known)."""
    if value is None:
        return
    if isinstance(value, str):
        if value not in DEPTH_SCHEDULES:
            raise DraftheadsError(f"train.depth_weights must be one of {', '.join(DEPTH_SCHEDULES)} or a list of "
                                  f"weights, got {value!r}")
        return
    weights = list(value)
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise DraftheadsError(f"train.depth_weights must be weights >= 0, not all 0, got {weights}")
    if depths is not None and len(weights) != depths:
        raise DraftheadsError(f"train.depth_weights lists {len(weights)} weights but this drafter trains {depths} "
                              f"depths; give {depths}")


def depth_weights(objective: Objective, head_weights: list[float], correct=None, total=None) -> list[float]:
    """The weight of each depth: the head's own, or the recipe's schedule scaled to their sum. `reach` needs the
    batch's top-1 hits and counts per depth (tensors [D]); it reads them without gradient. A list was checked
    against the head's depths once, by take_objective."""
    chosen = objective.depth_weights
    if chosen is None:
        return list(head_weights)
    if isinstance(chosen, str):
        weights = schedule(chosen, len(head_weights), correct, total)
    else:
        weights = [float(w) for w in chosen]
    scale = sum(head_weights) / sum(weights) if sum(weights) > 0 else 0.0
    return [w * scale for w in weights]


def default_gamma(block_size: int) -> float:
    """The slot-weight decay the DFlash trainers use at B = 8 (4) and B = 16 (7), on the line through both."""
    return max(1.0, 4.0 + 3.0 * (block_size - 8) / 8)


def schedule(name: str, depths: int, correct=None, total=None) -> list[float]:
    """A named depth schedule's raw weights for `depths` depths."""
    if name == "uniform":
        return [1.0] * depths
    if name == "fastmtp":
        return [0.6**k for k in range(depths)]
    if name == "dflash":
        gamma = default_gamma(depths + 1)  # DFlash's γ at a block of depths + 1 slots
        return [math.exp(-k / gamma) for k in range(depths)]
    if name == "reach":
        hits = torch.as_tensor(correct, dtype=torch.float64).detach().cpu()
        counts = torch.as_tensor(total, dtype=torch.float64).detach().cpu().clamp_min(1)
        accuracy = (hits / counts).tolist()
        return [math.prod(accuracy[:k]) for k in range(depths)]
    raise DraftheadsError(f"train.depth_weights must be one of {', '.join(DEPTH_SCHEDULES)} or a list of weights, "
                          f"got {name!r}")


def per_depth_mean(weights: list[float], loss_sums, totals) -> torch.Tensor:
    """Σ_k w_k · (loss sum_k / count_k): each depth's mean, weighted (EAGLE, Medusa, MTP)."""
    return sum(w * s / max(int(n), 1) for w, s, n in zip(weights, loss_sums, totals))


def pooled_mean(weights: list[float], loss_sums, totals) -> torch.Tensor:
    """Σ_k w_k · loss sum_k / Σ_k w_k · count_k: a weighted mean over every counted position (the block drafters)."""
    denominator = sum(w * int(n) for w, n in zip(weights, totals))
    return sum(w * s for w, s in zip(weights, loss_sums)) / max(denominator, 1.0)
