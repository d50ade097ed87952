"""The draft modules. `HEAD_TYPES` maps a recipe's `head.type` to its config class."""

from draftheads.heads.eagle import EagleConfig
from draftheads.heads.medusa import MedusaConfig
from draftheads.heads.mtp import MTPConfig

HEAD_CONFIGS = {"medusa": MedusaConfig, "eagle": EagleConfig, "mtp": MTPConfig}
