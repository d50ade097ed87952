"""What a drafter's folder holds besides config.json (interop/native.py writes it): a component each drafter has as
`drafter.files`, so the native format asks every drafter the same two questions.

    drafter.files.module          the nn.Module whose state_dict is the weights file (never the target's weights)
    drafter.files.save_extras(f)  write what the weights file does not hold into folder f
    drafter.files.load_extras(f)  read it back, after bind

Every head's weights file holds all it has (`WeightsOnly`); Medusa-2 adds its LoRA adapter (heads/medusa2.py).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn


class WeightsOnly:
    """A drafter whose weights file is all it saves."""

    def __init__(self, module: nn.Module):
        self.module = module

    def save_extras(self, folder: Path) -> None:
        """Nothing beside the weights file."""

    def load_extras(self, folder: Path) -> None:
        """Nothing beside the weights file."""
