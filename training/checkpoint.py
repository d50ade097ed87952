"""Checkpoints: runs/<name>/step_000500/ written atomically, found again on resume, pruned to keep_last.

A checkpoint folder holds:
  accelerate state (save_state: drafter weights, optimizer, scheduler, RNG of every process)
  drafter/             the drafter in the native format (model.safetensors + config.json)
  recipe.yaml          the resolved recipe
  trainer_state.json   step, data position, best metric, logged history
  COMPLETE             written last, inside the temporary folder, before the rename
It is built in `step_000500.tmp/` and renamed into place (core/folders.py), so a crash leaves either
a complete checkpoint or a `.tmp` folder that resume skips (and the next save of that step replaces).
The names of a run folder's parts are core/run_folder.py's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import publish, staging_folder, staging_path
from draftheads.core.run_folder import COMPLETE, DRAFTER, RECIPE_FILE, STATE_FILE, list_checkpoints, step_dir
from draftheads.interop.native import save_drafter


def find_resume(run_dir: Path, resume: str) -> Path | None:
    """The checkpoint to resume from: 'auto' = newest complete one (or None), 'never' = None, else that folder."""
    if resume == "never":
        return None
    if resume == "auto":
        done = list_checkpoints(run_dir)
        return done[-1] if done else None
    folder = Path(resume)
    if not folder.is_dir():
        raise DraftheadsError(f"train.resume: checkpoint '{resume}' not found; use auto, never, or a step_NNNNNN folder")
    if not (folder / COMPLETE).is_file():
        raise DraftheadsError(f"train.resume: '{resume}' is a half-written checkpoint (no {COMPLETE} marker); pick an earlier one")
    return folder


def save_checkpoint(accelerator, run_dir: Path, step: int, drafter, state: dict, recipe_dict: dict, target=None) -> Path:
    """Write step_NNNNNN/ atomically. Every process must call this (save_state stores each one's RNG)."""
    final = step_dir(run_dir, step)
    tmp = staging_path(final)
    if accelerator.is_main_process:
        staging_folder(final)  # removes what a crash during an earlier save of this step left
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    if accelerator.is_main_process:
        save_drafter(drafter, tmp / DRAFTER, target=target, extra={"step": step})
        write_recipe(tmp / RECIPE_FILE, recipe_dict)
        write_json(tmp / STATE_FILE, state)
        (tmp / COMPLETE).write_text(f"step {step}\n")
        publish(tmp, final)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, folder: Path) -> dict:
    """Restore weights, optimizer, scheduler and RNG from `folder`; return its trainer state."""
    accelerator.load_state(str(folder))
    return json.loads((Path(folder) / STATE_FILE).read_text())


def prune(run_dir: Path, keep_last: int, protect: int | None = None) -> list[Path]:
    """Delete all but the newest keep_last complete checkpoints, never the one at step `protect` (the best)."""
    done = list_checkpoints(run_dir)
    old = done[:-keep_last] if keep_last > 0 else done
    removed = []
    for folder in old:
        if protect is not None and folder.name == step_dir(run_dir, protect).name:
            continue
        shutil.rmtree(folder)
        removed.append(folder)
    return removed


def write_recipe(path: Path, recipe_dict: dict) -> None:
    """The resolved recipe as YAML that `load_recipe` reads back (derived values go in a comment)."""
    data = {k: v for k, v in recipe_dict.items() if k != "derived"}
    derived = recipe_dict.get("derived", {})
    header = "# resolved recipe of this run; derived from the target: " + ", ".join(f"{k}={v}" for k, v in derived.items())
    Path(path).write_text(header + "\n" + yaml.safe_dump(data, sort_keys=False))


def write_json(path: Path, data: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)

