"""Checkpoints: runs/<name>/step_000500/ written atomically, found again on resume, pruned to keep_last.

A checkpoint folder holds:
  accelerate state (save_state: drafter weights, optimizer, scheduler, RNG of every process)
  drafter/             the drafter in the native format (model.safetensors + config.json)
  recipe.yaml          the resolved recipe
  trainer_state.json   step, data position, best metric, logged history
  COMPLETE             written last, inside the temporary folder, before the rename
It is built in `step_000500.tmp/` and renamed into place, so a crash leaves either a complete
checkpoint or a `.tmp` folder that resume skips (and the next save of that step replaces).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import yaml

from draftheads.errors import DraftheadsError

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"
STEP_RE = re.compile(r"^step_(\d{6,})$")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"step_{step:06d}"


def is_complete(folder: Path) -> bool:
    return STEP_RE.match(folder.name) is not None and (folder / COMPLETE).is_file() and (folder / STATE_FILE).is_file()


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(STEP_RE.match(p.name).group(1)))


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """Half-written checkpoint folders (a crash during a save): skipped by resume."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("step_") and not is_complete(p))


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
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process and tmp.exists():
        shutil.rmtree(tmp)  # left by a crash during an earlier save of this step
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    if accelerator.is_main_process:
        write_drafter(drafter, tmp / "drafter", target, {"step": step})
        write_recipe(tmp / "recipe.yaml", recipe_dict)
        write_json(tmp / STATE_FILE, state)
        (tmp / COMPLETE).write_text(f"step {step}\n")
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
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


def write_drafter(drafter, folder: Path, target=None, extra: dict | None = None) -> Path:
    """The drafter in the native format (model.safetensors + config.json)."""
    from draftheads.heads.native import save_drafter

    save_drafter(drafter, folder, target=target, extra=extra)
    return folder


def replace_folder(build, final: Path) -> Path:
    """Build a folder with build(tmp_path), then swap it in for `final` (old copy removed last)."""
    final = Path(final)
    tmp, old = final.with_name(final.name + ".tmp"), final.with_name(final.name + ".old")
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    tmp.mkdir(parents=True)
    build(tmp)
    _fsync_dir(tmp)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


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


def _fsync_dir(folder: Path) -> None:
    """Flush file contents before the rename that publishes them (a power cut must not publish empty files)."""
    for path in Path(folder).rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
