"""The public entry points; each delegates to the subpackage that owns the work."""

from __future__ import annotations

from draftheads.errors import NotImplementedYet
from draftheads.training.target import load_target

__all__ = ["load_target", "build_drafter", "load_drafter", "speculative_generate"]


def build_drafter(head_type: str, target, **cfg):
    """A new, untrained drafter of `head_type` ('medusa', 'eagle', 'mtp') wired to `target`."""
    raise NotImplementedYet("build_drafter")


def load_drafter(path, target):
    """A trained drafter from `path` (native format), checked against and wired to `target`."""
    raise NotImplementedYet("load_drafter")


def speculative_generate(target, drafter, input_ids, **kwargs):
    """Generate with speculative decoding; see draftheads.inference.generate."""
    raise NotImplementedYet("speculative_generate")
