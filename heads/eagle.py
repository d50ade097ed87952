"""EAGLE — Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty" (EAGLE-1/2), and Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test".

EAGLE-1/2: [emb(x_{t+1}); f_t] [b, s, 2H] -> fc -> decoder layer -> f̂_{t+1} -> target lm_head
EAGLE-3:   [h_low; h_mid; h_high] [b, s, 3H] -> fc -> layer over [norm(emb); norm(h)] -> norm -> draft lm_head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.config import check, doc

MAX_TTT_STEPS = 16


@dataclass
class EagleConfig:
    """EAGLE layer hyper-parameters (hidden size, vocabulary and layer count come from the target)."""

    type: Literal["eagle"] = doc("eagle", "head type")
    eagle3: bool = doc(False, "EAGLE-3: fused low/mid/high features, training-time test, reduced draft vocabulary")
    feature_layers: list[int] | None = doc(None, "EAGLE-3: target layers whose outputs are fused (default {2, N//2, N-3})")
    draft_vocab_size: int | None = doc(None, "EAGLE-3: draft vocabulary size (default min(32000, target vocab))")
    ttt_steps: int = doc(1, "training-time test: unroll this many steps on the drafter's own outputs")
    ttt_decay: float = doc(0.8, "training-time test: step j's loss is weighted decay^j")
    feature_loss_weight: float = doc(1.0, "EAGLE-1/2: weight of SmoothL1(f̂, f)")
    token_loss_weight: float = doc(0.1, "EAGLE-1/2: weight of the token cross-entropy")
    input_noise: float = doc(0.2, "width of the uniform noise added to input features during training (0 = off)")
    default_tree: str = doc("dynamic:8,6,48", "tree used when the caller gives none (chain:K, dynamic:TOPK,DEPTH,TOTAL)")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check(1 <= self.ttt_steps <= MAX_TTT_STEPS, f"head.ttt_steps must be between 1 and {MAX_TTT_STEPS}, got {self.ttt_steps}")
        check(0 < self.ttt_decay <= 1, f"head.ttt_decay must be in (0, 1], got {self.ttt_decay}")
        check(self.input_noise >= 0, f"head.input_noise must be >= 0, got {self.input_noise}")
        check(self.token_loss_weight >= 0 and self.feature_loss_weight >= 0, "head loss weights must be >= 0")
        check(self.draft_vocab_size is None or self.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
        if self.feature_layers is not None:
            check(len(self.feature_layers) == 3, f"head.feature_layers must list 3 target layers, got {len(self.feature_layers)}")
            check(self.eagle3, "head.feature_layers only applies with head.eagle3: true")
        if not self.eagle3:
            check(self.draft_vocab_size is None, "head.draft_vocab_size only applies with head.eagle3: true")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        if not self.eagle3:
            return
        if self.feature_layers is None:
            self.feature_layers = [2, num_layers // 2, num_layers - 3] if num_layers >= 6 else [0, num_layers // 2, num_layers - 1]
        for layer in self.feature_layers:
            check(0 <= layer < num_layers, f"head.feature_layers: layer {layer} does not exist (the target has {num_layers} layers)")
        if self.draft_vocab_size is None:
            self.draft_vocab_size = min(32000, vocab_size)
        check(self.draft_vocab_size <= vocab_size, f"head.draft_vocab_size {self.draft_vocab_size} exceeds the target vocabulary ({vocab_size})")

    @property
    def depth(self) -> int:
        return MAX_TTT_STEPS  # autoregressive: any draft depth
