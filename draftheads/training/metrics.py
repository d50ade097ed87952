"""Per-depth draft metrics summed over batches and processes, and the simulated acceptance length.

A drafter's `training_loss` returns, per draft depth k (k = 0 is the token after the target's own
next token): `correct[k]` top-1 hits, `total[k]` counted positions, `loss_sum[k]` summed loss.
Accuracy acc_k = correct_k / total_k. If depth k is accepted only when every depth before it was,
the expected number of accepted draft tokens per step is  sum_k prod_{j<=k} acc_j  — the
"simulated acceptance length" we select checkpoints by (loss does not track it well for deep heads).
"""

from __future__ import annotations

import torch


class DepthStats:
    """Running sums of the drafter's metrics plus the scalar loss, tokens and micro-batch count.

    Kept as one flat float64 vector so a single all-reduce sums it over processes:
    [correct (D) | total (D) | loss_sum (D) | loss, tokens, micro_batches]. D is learnt from the
    first metrics added (or from a saved vector), so the same class serves every head type.
    """

    def __init__(self, values: list[float] | None = None):
        self.values = torch.tensor(values, dtype=torch.float64) if values else None

    @property
    def depth(self) -> int:
        return 0 if self.values is None else (len(self.values) - 3) // 3

    def add(self, metrics: dict, loss: torch.Tensor, tokens: int) -> None:
        row = torch.cat([
            metrics["correct"].detach().double().cpu(), metrics["total"].detach().double().cpu(),
            metrics["loss_sum"].detach().double().cpu(),
            torch.tensor([float(loss.detach()), float(tokens), 1.0], dtype=torch.float64),
        ])
        self.values = row if self.values is None else self.values + row

    def merge(self, other: "DepthStats") -> None:
        if other.values is not None:
            self.values = other.values.clone() if self.values is None else self.values + other.values

    def summary(self) -> dict:
        """loss (mean over micro-batches), acc / depth_loss per depth, accept_len, positions, tokens."""
        d, v = self.depth, self.values
        if v is None:
            return {"loss": float("nan"), "acc": [], "depth_loss": [], "accept_len": 0.0, "positions": 0, "tokens": 0}
        total = v[d:2 * d].clamp(min=1)
        acc = (v[:d] / total).tolist()
        return {
            "loss": float(v[3 * d] / max(float(v[3 * d + 2]), 1.0)),
            "acc": acc,
            "depth_loss": (v[2 * d:3 * d] / total).tolist(),
            "accept_len": acceptance_length(acc),
            "positions": int(v[d]),
            "tokens": int(v[3 * d + 1]),
        }

    def state(self) -> list[float] | None:
        return None if self.values is None else self.values.tolist()


def acceptance_length(acc: list[float]) -> float:
    """sum_k prod_{j<=k} acc_j: expected accepted draft tokens per step if depths accept in order."""
    out, run = 0.0, 1.0
    for a in acc:
        run *= a
        out += run
    return out


def flat_metrics(prefix: str, summary: dict) -> dict:
    """Tracker-friendly scalars: prefix/loss, prefix/acc_1 ..., prefix/accept_len."""
    out = {f"{prefix}/loss": summary["loss"], f"{prefix}/accept_len": summary["accept_len"]}
    for k, (a, l) in enumerate(zip(summary["acc"], summary["depth_loss"]), start=1):
        out[f"{prefix}/acc_{k}"] = a
        out[f"{prefix}/loss_{k}"] = l
    return out
