"""The public entry points; each is one call into the package that owns the work."""

from __future__ import annotations

from draftheads.data.target import load_target
from draftheads.decoding.generate import speculative_generate
from draftheads.heads.factory import bound_drafter, head_config
from draftheads.interop.load import load_drafter

__all__ = ["load_target", "build_drafter", "load_drafter", "speculative_generate"]


def build_drafter(head_type: str, target, **cfg):
    """A new, untrained drafter of `head_type` (a key of heads/factory.KINDS: 'medusa', 'medusa2', 'eagle', 'eagle3',
    'mtp', 'dflash', 'peagle') wired to `target`.

    `cfg` holds head hyper-parameters (the recipe's `head:` keys); values derived from the target
    (layer ids, draft vocabulary) are filled in. The drafter is bound to the target's frozen
    shared modules and placed on the target's device and dtype.
    """
    return bound_drafter(head_config({**cfg, "type": head_type}), target)
