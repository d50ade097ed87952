"""The draft modules. `HEAD_CONFIGS` maps a recipe's `head.type` to its config class,
`HEAD_TYPES` to its drafter class (each has `from_target(target_config, cfg)`)."""

from draftheads.heads.eagle import EagleConfig, EagleDrafter
from draftheads.heads.medusa import MedusaConfig, MedusaDrafter
from draftheads.heads.mtp import MTPConfig, MTPDrafter

HEAD_CONFIGS = {"medusa": MedusaConfig, "eagle": EagleConfig, "mtp": MTPConfig}
HEAD_TYPES = {"medusa": MedusaDrafter, "eagle": EagleDrafter, "mtp": MTPDrafter}
