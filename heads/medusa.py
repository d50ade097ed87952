"""Medusa heads — Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads".

h_t [b, s, H] (target's last hidden state, after its final norm)
  -> head k: num_layers residual blocks y + SiLU(W y + b) -> lm head -> logits for x_{t+k+1}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.config import check, doc

MAX_HEADS = 10


@dataclass
class MedusaConfig:
    """Medusa head hyper-parameters (hidden size and vocabulary come from the target)."""

    type: Literal["medusa"] = doc("medusa", "head type")
    num_heads: int = doc(4, "K: head k predicts token t+k+1")
    num_layers: int = doc(1, "residual blocks per head (each with its own weights)")
    lm_head: Literal["shared", "own"] = doc("shared", "'shared': the target's frozen lm_head; 'own': a trainable copy per head")
    loss_decay: float = doc(0.8, "lambda: head k's loss is weighted lambda^(k-1)")
    medusa2: bool = doc(False, "Medusa-2: train LoRA on the target jointly with the heads")
    medusa2_loss: Literal["lm", "kl"] = doc("lm", "Medusa-2 target loss: next-token CE, or KL to the adapter-disabled target")
    medusa2_head_weight: float = doc(0.2, "Medusa-2: weight of the heads' loss next to the target loss")
    head_lr: float | None = doc(None, "Medusa-2: learning rate of the heads (default: 4x train.lr)")
    lora_r: int = doc(16, "Medusa-2 LoRA rank")
    lora_alpha: int = doc(32, "Medusa-2 LoRA alpha")
    lora_dropout: float = doc(0.05, "Medusa-2 LoRA dropout")
    lora_target_modules: list[str] = doc(["q_proj", "k_proj", "v_proj", "o_proj"], "Medusa-2 LoRA target module names")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check(1 <= self.num_heads <= MAX_HEADS, f"head.num_heads must be between 1 and {MAX_HEADS}, got {self.num_heads}")
        check(1 <= self.num_layers <= 8, f"head.num_layers must be between 1 and 8, got {self.num_layers}")
        check(0 < self.loss_decay <= 1, f"head.loss_decay must be in (0, 1], got {self.loss_decay}")
        check(self.medusa2_head_weight > 0, "head.medusa2_head_weight must be positive")
        check(self.head_lr is None or self.head_lr > 0, f"head.head_lr must be positive, got {self.head_lr}")
        check(self.lora_r > 0, f"head.lora_r must be positive, got {self.lora_r}")
        check(0 <= self.lora_dropout < 1, f"head.lora_dropout must be in [0, 1), got {self.lora_dropout}")

    @property
    def depth(self) -> int:
        """How many tokens past the target's own next token this drafter can propose."""
        return self.num_heads
