"""Multi-token prediction modules — DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2.

module k: h^k_t = Block(W [RMSNorm(h^{k-1}_t); RMSNorm(emb(x_{t+k}))]) [b, s, H], h^0 = target hidden
          -> shared target output head -> logits for x_{t+k+1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.config import check, doc

MAX_DEPTH = 8


@dataclass
class MTPConfig:
    """MTP hyper-parameters (hidden size, vocabulary and the block's class come from the target)."""

    type: Literal["mtp"] = doc("mtp", "head type")
    depth: int = doc(3, "D: number of sequential modules; module k predicts token t+k+1")
    loss_weights: list[float] | None = doc(None, "per-depth loss weights (default 1.0 each)")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:depth)")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check(1 <= self.depth <= MAX_DEPTH, f"head.depth must be between 1 and {MAX_DEPTH}, got {self.depth}")
        if self.loss_weights is not None:
            check(len(self.loss_weights) == self.depth,
                  f"head.loss_weights has {len(self.loss_weights)} entries but head.depth is {self.depth}")
            check(all(w >= 0 for w in self.loss_weights), "head.loss_weights must be >= 0")
