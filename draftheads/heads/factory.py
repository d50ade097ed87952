"""Building a drafter, the one way every caller does it (the API, training, the drafter formats).

    config = head_config({"type": "eagle", "ttt_steps": 2})   # a recipe's head: section, validated
    drafter = bound_drafter(config, target)                   # resolved, bound, on the target's device and dtype
    drafter = new_drafter(config, target.config)              # resolved, unbound: shapes only (export checks)

A recipe's head.type picks the config class (`HEAD_CONFIGS`); the config picks the module:
EAGLE-3 and Medusa-2 are modules of their own, chosen by their config's flag.
"""

from __future__ import annotations

import copy

from draftheads.core.config import build, suggest
from draftheads.core.drafter import TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.heads.common import place_like
from draftheads.heads.eagle import EagleConfig, EagleDrafter
from draftheads.heads.eagle3 import Eagle3Drafter
from draftheads.heads.medusa import MedusaConfig, MedusaDrafter
from draftheads.heads.medusa2 import Medusa2Drafter
from draftheads.heads.mtp import MTPConfig, MTPDrafter

HEAD_CONFIGS = {"medusa": MedusaConfig, "eagle": EagleConfig, "mtp": MTPConfig}
HeadConfig = MedusaConfig | EagleConfig | MTPConfig


def head_config(data, where: str = "head") -> HeadConfig:
    """A head config from a mapping with a `type` (a recipe's head: section, a saved config.json's head)."""
    if not isinstance(data, dict) or "type" not in data:
        raise DraftheadsError(f"{where}: missing 'type'; use one of {', '.join(HEAD_CONFIGS)}")
    kind = data["type"]
    if kind not in HEAD_CONFIGS:
        raise DraftheadsError(f"{where}.type: unknown head type '{kind}'{suggest(str(kind), HEAD_CONFIGS)}; "
                              f"use one of {', '.join(HEAD_CONFIGS)}")
    return build(HEAD_CONFIGS[kind], data, where)


def drafter_class(config: HeadConfig) -> type:
    if isinstance(config, EagleConfig):
        return Eagle3Drafter if config.eagle3 else EagleDrafter
    if isinstance(config, MedusaConfig):
        return Medusa2Drafter if config.medusa2 else MedusaDrafter
    return MTPDrafter


def new_drafter(config: HeadConfig, target_config) -> TrainableDrafter:
    """A freshly initialised drafter for a target with `target_config`, not yet bound to the target.

    The drafter gets its own copy of `config`, with the values derived from the target filled in."""
    config = copy.deepcopy(config)
    dims = target_dims(target_config)
    config.resolve(dims.num_layers, dims.vocab_size)
    return drafter_class(config).from_target(target_config, config)


def bound_drafter(config: HeadConfig, target) -> TrainableDrafter:
    """A new drafter bound to `target`'s frozen shared modules, on the target's device and dtype."""
    return place_like(new_drafter(config, target.config).bind(target), target)
