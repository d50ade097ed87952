"""Building a drafter, the one way every caller does it (the API, training, the drafter formats).

    config = head_config({"type": "eagle3", "ttt_steps": 2})   # a recipe's head: section, validated
    drafter = bound_drafter(config, target)                    # resolved, bound, on the target's device and dtype
    drafter = new_drafter(config, target.config)               # resolved, unbound: shapes only (export checks)

A head's `type` picks its config class and its module (`KINDS`): medusa, medusa2, eagle (EAGLE-1/2), eagle3, mtp,
dflash, dspark and peagle (block-parallel), native (the MTP layers a checkpoint ships) and assistant (Gemma 4's
assistant drafters).
"""

from __future__ import annotations

import copy
import sys

import torch

from draftheads.core.config import build, suggest
from draftheads.core.drafter import TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.target_family import recurrent_layers
from draftheads.core.tree import Tree, parse_tree
from draftheads.heads.assistant import AssistantConfig, AssistantDrafter
from draftheads.heads.dflash import DFlashConfig, DFlashDrafter
from draftheads.heads.dspark import DSparkConfig, DSparkDrafter
from draftheads.heads.eagle import EagleConfig, EagleDrafter
from draftheads.heads.eagle3 import Eagle3Config, Eagle3Drafter
from draftheads.heads.medusa import MedusaConfig, MedusaDrafter
from draftheads.heads.medusa2 import Medusa2Config, Medusa2Drafter
from draftheads.heads.mtp import MTPConfig, MTPDrafter
from draftheads.heads.native_mtp import NativeConfig
from draftheads.heads.parts.common import place_like
from draftheads.heads.peagle import PEagleConfig, PEagleDrafter

KINDS = {"medusa": (MedusaConfig, MedusaDrafter), "medusa2": (Medusa2Config, Medusa2Drafter),
         "eagle": (EagleConfig, EagleDrafter), "eagle3": (Eagle3Config, Eagle3Drafter), "mtp": (MTPConfig, MTPDrafter),
         "dflash": (DFlashConfig, DFlashDrafter), "dspark": (DSparkConfig, DSparkDrafter),
         "peagle": (PEagleConfig, PEagleDrafter),
         "native": (NativeConfig, MTPDrafter),   # a checkpoint's own MTP layers: MTP modules of its structure
         "assistant": (AssistantConfig, AssistantDrafter)}
HeadConfig = (MedusaConfig | Medusa2Config | EagleConfig | Eagle3Config | MTPConfig | DFlashConfig | DSparkConfig
              | PEagleConfig | NativeConfig | AssistantConfig)

# Before EAGLE-3 and Medusa-2 were kinds of their own they were flags of EAGLE's and Medusa's configs; a head
# written that way (an older recipe or drafter folder) is read as its kind. Settings the kind does not have (the
# other variant's, which that variant ignored) are dropped; Medusa-2's own settings lost their prefix.
FLAGS = {("eagle", "eagle3"): "eagle3", ("medusa", "medusa2"): "medusa2"}
OTHER_VARIANT = {"eagle": ("feature_layers", "draft_layer"), "eagle3": ("feature_loss_weight", "token_loss_weight"),
                 "medusa": ("medusa2_loss", "medusa2_head_weight", "lora_r", "lora_alpha", "lora_dropout",
                            "lora_target_modules"), "medusa2": (), "dflash": (), "dspark": (), "peagle": (),
                 "native": (), "assistant": ()}
RENAMED = {"medusa2_loss": "target_loss", "medusa2_head_weight": "heads_weight"}


def upgrade_head(data: dict) -> tuple[dict, str | None]:
    """A head section with an `eagle3:` or `medusa2:` flag as its kind, and a note saying so (None: nothing to do)."""
    flag = next((f for (kind, f) in FLAGS if data.get("type") == kind and f in data), None)
    if flag is None:
        return data, None
    kind = FLAGS[(data["type"], flag)] if data[flag] else data["type"]
    head = {RENAMED.get(k, k): v for k, v in data.items() if k != flag and k not in OTHER_VARIANT[kind]}
    head["type"] = kind
    return head, f"note: head.{flag}: {str(data[flag]).lower()} is read as head.type: {kind}; write that instead"


def head_config(data, where: str = "head", note=lambda line: print(line, file=sys.stderr)) -> HeadConfig:
    """A head config from a mapping with a `type` (a recipe's head: section, a saved config.json's head)."""
    if not isinstance(data, dict) or "type" not in data:
        raise DraftheadsError(f"{where}: missing 'type'; use one of {', '.join(KINDS)}")
    data, upgraded = upgrade_head(data)
    if upgraded:
        note(upgraded)
    kind = data["type"]
    if kind not in KINDS:
        raise DraftheadsError(f"{where}.type: unknown head type '{kind}'{suggest(str(kind), KINDS)}; "
                              f"use one of {', '.join(KINDS)}")
    return build(KINDS[kind][0], data, where)


def drafter_class(config: HeadConfig) -> type:
    return KINDS[config.type][1]


def new_drafter(config: HeadConfig, target_config) -> TrainableDrafter:
    """A freshly initialised drafter for a target with `target_config`, not yet bound to the target.

    The drafter gets its own copy of `config`, with the values derived from the target filled in."""
    config = copy.deepcopy(config)
    dims = target_dims(target_config)
    config.resolve(dims.num_layers, dims.vocab_size)
    return drafter_class(config).from_target(target_config, config)


def fit_to_target(config: HeadConfig, target_config, note=lambda line: print(line, file=sys.stderr)) -> None:
    """Refuse, in one line and before a target's weights load, a head its family cannot carry: the drafter is built
    on the meta device (shapes only, nothing allocated). On a target whose layers keep a recurrent state (Qwen3-Next,
    Qwen3.5), which verifies chains only, a default tree with branches becomes the chain of its depth, with a note."""
    tree = getattr(config, "default_tree", None)
    if tree and recurrent_layers(target_config):
        spec = parse_tree(tree, "head.default_tree")
        if not (isinstance(spec, Tree) and spec.is_chain):
            config.default_tree = f"chain:{spec.depth}"
            note(f"note: head.default_tree {tree} becomes chain:{spec.depth}: this {target_config.model_type} "
                 "target's linear-attention state verifies chains only")
    try:
        with torch.device("meta"):
            new_drafter(config, target_config)
    except DraftheadsError:
        raise
    except Exception as e:  # noqa: BLE001 - a family transformers builds in ways this kind cannot follow
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DraftheadsError(f"head.type {config.type} cannot be built for a {target_config.model_type} target "
                              f"({type(e).__name__}: {first}); choose another head.type") from None


def bound_drafter(config: HeadConfig, target) -> TrainableDrafter:
    """A new drafter bound to `target`'s frozen shared modules, on the target's device and dtype."""
    return place_like(new_drafter(config, target.config).bind(target), target)
