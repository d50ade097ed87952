"""The settings of `draftheads drift` (DriftConfig: what the target's shift is measured on) and of `draftheads
update-target` (UpdateConfig), checked here. Plain Python, no torch: the CLI builds their flags from these fields.

    UpdateConfig(method="full", steps=40)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from draftheads.core.config import check, doc

SHIFT_ROWS = 64
DEFAULT_LR = {"lora": 2e-4, "full": 2e-5}


@dataclass
class DriftConfig:
    """What `draftheads drift` measures the target's shift on (its own settings; the evaluation's are EvalConfig)."""

    rows: int = doc(SHIFT_ROWS, "rows of the old target's data the shift is measured on", flag="--rows")

    def __post_init__(self):
        check(self.rows >= 1, f"drift --rows must be a whole number >= 1 (rows the shift is measured on), got "
                              f"{self.rows}; e.g. --rows {SHIFT_ROWS}")


@dataclass
class UpdateConfig:
    """How a target is updated (`draftheads update-target`)."""

    method: Literal["lora", "full"] = doc("lora", "'lora': low-rank adapters on every projection, merged; 'full': "
                                                  "every weight", flag="--method")
    steps: int = doc(60, "optimizer steps: the strength of the update", flag="--steps")
    lr: float | None = doc(None, "AdamW learning rate (None: 2e-4 for lora, 2e-5 for full)", flag="--lr")
    rank: int = doc(16, "lora: adapter rank (alpha = 2 x rank)", flag="--rank")
    batch_size: int = doc(8, "rows per step", flag="--batch-size")
    max_length: int = doc(512, "longest row in tokens (longer rows are cut)")
    warmup_steps: int = doc(5, "linear warm-up steps")
    seed: int = doc(0, "row order and adapter initialisation")
    base: str = doc("smollm2-135m", "the target being updated", flag="--base")

    def __post_init__(self):
        check(self.method in DEFAULT_LR, f"update method must be lora or full, got '{self.method}'")
        for name, flag in (("steps", " (--steps)"), ("rank", " (--rank)"), ("batch_size", " (--batch-size)"),
                           ("max_length", "")):
            value = getattr(self, name)
            check(value > 0, f"update {name}{flag} must be a whole number >= 1, got {value}")
        check(self.warmup_steps >= 0, f"update warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.lr is None or (math.isfinite(self.lr) and self.lr > 0),   # NaN and inf would train to NaN
              f"update lr (--lr) must be a finite number > 0, got {self.lr}; e.g. 2e-4 (lora) or 2e-5 (full)")
        if self.lr is None:
            self.lr = DEFAULT_LR[self.method]
