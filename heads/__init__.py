"""The draft modules. `HEAD_CONFIGS` maps a recipe's `head.type` to its config class,
`HEAD_TYPES` to its drafter class (each has `from_target(target_config, cfg)`)."""

from draftheads.heads import eagle, mtp
from draftheads.heads.eagle import EagleConfig
from draftheads.heads.medusa import MedusaConfig, MedusaDrafter
from draftheads.heads.mtp import MTPConfig

HEAD_CONFIGS = {"medusa": MedusaConfig, "eagle": EagleConfig, "mtp": MTPConfig}

# EAGLE and MTP drafters join as their modules define them (written in parallel).
HEAD_TYPES = {
    name: cls
    for name, cls in (
        ("medusa", MedusaDrafter),
        ("eagle", getattr(eagle, "EagleDrafter", None)),
        ("mtp", getattr(mtp, "MTPDrafter", None)),
    )
    if cls is not None
}
