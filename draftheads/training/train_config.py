"""`train:`, the settings of the training loop (training/loop.py), checked once where they live."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.core.config import check, doc
from draftheads.heads.parts.objective import DepthSchedule, Loss, check_depth_weights


@dataclass
class TrainConfig:
    """The Accelerate training loop (`draftheads train`)."""

    output_dir: str | None = doc(None, "run folder (default runs/<name>)")
    mode: Literal["online", "offline", "hybrid"] = doc("online", "'online': target forward every step; 'offline': "
                                                                 "features cached to disk once, before training; "
                                                                 "'hybrid': cached as the first epoch computes them")
    max_steps: int = doc(1000, "optimizer steps")
    time_budget_minutes: float | None = doc(None, "the wall-clock budget this recipe is sized for on its "
                                                  "stated hardware")
    batch_size: int = doc(8, "sequences per micro-batch per process")
    grad_accum: int = doc(1, "micro-batches per optimizer step")
    max_length: int = doc(1024, "longest training sequence in tokens")
    more_data: list[str] = doc([], "finished `draftheads data` folders trained on after data.output's rows (another "
                                   "recipe's mixture, e.g. more of one task kind), made for the same target")
    draft_vocab_from: str | None = doc(None, "reuse a draft vocabulary instead of choosing the most frequent tokens: "
                                             "SpecForge's vocab_mapping .pt, speculators' d2t.npy, or a draftheads "
                                             "drafter/run folder")
    bucket_by_length: bool = doc(True, "batch rows of similar length together (less padding); rows never attend to "
                                       "each other")
    pack: bool = doc(False, "pack whole rows into sequences of up to max_length tokens (first-fit-decreasing; "
                            "batch_size then counts sequences): no padding, and rows still never see each other")
    loss: Loss | None = doc(
        None, "the token loss against the target (heads/parts/objective.py): kl (soft CE on its distribution), ce (on "
              "its token), rkl, jsd, tv, lk_alpha or lk_lambda (LK losses, arXiv 2602.23881); default: the head's own")
    depth_weights: DepthSchedule | list[float] | None = doc(
        None, "weights of the drafted depths: uniform, fastmtp (0.6^k), dflash (exp(-k/gamma)), reach (by the chance "
              "each depth is reached) or one weight per depth, scaled to the head's own sum; default: the head's own")
    lr: float = doc(3e-4, "AdamW learning rate")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    betas: list[float] = doc([0.9, 0.95], "AdamW betas")
    warmup_steps: int = doc(50, "linear warm-up steps")
    schedule: Literal["cosine", "linear", "constant"] = doc("cosine", "learning-rate schedule after warm-up")
    max_grad_norm: float = doc(1.0, "gradient clipping (0 = off)")
    seed: int = doc(0, "seed for weights, data order and noise")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = doc("auto", "'auto': bf16 where the hardware has native "
                                                                 "bf16, else fp32")
    eval_fraction: float = doc(0.05, "share of rows held out for evaluation")
    eval_every: int = doc(200, "evaluate every N steps")
    save_every: int = doc(500, "checkpoint every N steps")
    keep_last: int = doc(2, "checkpoints kept (the best one is kept too)")
    resume: str = doc("auto", "'auto' (newest complete checkpoint), 'never', or a checkpoint folder")
    log_every: int = doc(10, "log metrics every N steps")
    feature_dtype: Literal["bf16", "fp16", "fp32"] = doc("bf16", "offline mode: dtype of cached features (fp32 doubles "
                                                                 "the disk size)")
    shard_target: bool = doc(False, "FSDP launches: shard the frozen target's decoder layers over the processes "
                                    "(forward-only), so its memory per process falls with their count")
    feature_cache_max_gb: float | None = doc(None, "hybrid mode: disk the feature cache may take (rows past it stay "
                                                   "online)")
    feature_cache: str | None = doc(None, "offline mode: feature cache folder (default <data folder>/features/<key>)")

    def __post_init__(self):
        check(self.lr > 0, f"train.lr must be positive, got {self.lr}")
        for name in ("max_steps", "batch_size", "grad_accum", "max_length", "eval_every", "save_every", "log_every",
                     "keep_last"):
            check(getattr(self, name) > 0, f"train.{name} must be positive, got {getattr(self, name)}")
        check(self.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.max_grad_norm >= 0, f"train.max_grad_norm must be >= 0, got {self.max_grad_norm}")
        check(0 <= self.eval_fraction < 1, f"train.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
              f"train.betas must be two numbers in [0, 1), got {self.betas}")
        check(self.feature_cache_max_gb is None or self.feature_cache_max_gb >= 0,
              f"train.feature_cache_max_gb must be >= 0, got {self.feature_cache_max_gb}")
        check_depth_weights(self.depth_weights)  # a list's values; its length is checked against the head's depths
        check(self.time_budget_minutes is None or self.time_budget_minutes > 0,
              "train.time_budget_minutes must be positive")
