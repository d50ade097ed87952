"""Experiment tracking through Accelerate trackers (wandb, tensorboard, trackio), never needing an account.

wandb runs in offline mode (files under the run folder, `wandb sync` uploads them later) unless
the recipe sets log.wandb_mode: online.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from draftheads.core.config import check, doc, suggest
from draftheads.core.errors import DraftheadsError

PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard", "trackio": "trackio"}  # tracker -> the package it needs


@dataclass
class LogConfig:
    """Experiment tracking (never requires an account)."""

    trackers: list[str] = doc(["tensorboard"], "any of wandb, tensorboard, trackio")
    project: str = doc("draftheads", "project name in the trackers")
    wandb_mode: Literal["offline", "online"] = doc("offline", "wandb stays offline unless set to online")

    def __post_init__(self):
        for t in self.trackers:
            check(t in PACKAGES, f"log.trackers: unknown tracker '{t}'{suggest(t, PACKAGES)}; use any of "
                                 f"{', '.join(PACKAGES)}")


def check_trackers(names: list[str]) -> list[str]:
    """The tracker names, after checking each one's package is importable (one-line error naming the pip install)."""
    for name in names:
        package = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            install = "'draftheads[wandb]'" if name == "wandb" else package
            raise DraftheadsError(f"log.trackers includes '{name}' but the {package} package is not installed; "
                                  f"pip install {install}, or remove it from log.trackers")
    return list(names)


def prepare_environment(log_cfg, run_dir: Path) -> None:
    """Environment the tracker packages read at start-up: wandb offline unless configured online, files in the run
    folder."""
    if "wandb" in log_cfg.trackers:
        os.environ["WANDB_MODE"] = log_cfg.wandb_mode
        os.environ.setdefault("WANDB_DIR", str(Path(run_dir).resolve()))
        os.environ.setdefault("WANDB_SILENT", "true")
        Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
    if "trackio" in log_cfg.trackers:
        os.environ.setdefault("TRACKIO_DIR", str(Path(run_dir).resolve() / "trackio"))


def start_trackers(accelerator, log_cfg, run_name: str, config: dict) -> None:
    """init_trackers with the recipe as flat scalar hyper-parameters (what tensorboard's hparams accept)."""
    if not log_cfg.trackers:
        return
    init_kwargs = {"wandb": {"name": run_name, "mode": log_cfg.wandb_mode}, "trackio": {"name": run_name}}
    accelerator.init_trackers(log_cfg.project, config=flatten(config), init_kwargs={
        k: v for k, v in init_kwargs.items() if k in log_cfg.trackers
    })


def flatten(data: dict, prefix: str = "") -> dict:
    """{'train': {'lr': 1e-4}} -> {'train.lr': 1e-4}; lists and None become strings."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out
