"""The numbers `draftheads export` writes beside the weights (ExportConfig), checked here. Plain Python, no torch: the
CLI builds their flags from these fields."""

from __future__ import annotations

from dataclasses import dataclass

from draftheads.core.config import check, doc


@dataclass
class ExportConfig:
    """The numbers an export writes beside the weights (`draftheads export`'s flags that take one)."""

    speculative_tokens: int | None = doc(None, "draft length written where the engine's config takes one (None: the "
                                               "length the drafter was trained for)", flag="--speculative-tokens")

    def __post_init__(self):
        check(self.speculative_tokens is None or self.speculative_tokens >= 1,
              f"--speculative-tokens must be a whole number >= 1, got {self.speculative_tokens}; leave it out for the "
              "length the drafter was trained for")
