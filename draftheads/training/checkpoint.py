"""Checkpoints: runs/<name>/step_000500/ written atomically, verified and found again on resume, pruned to keep_last.

A checkpoint folder holds:
  accelerate state     save_state: drafter weights (safetensors), optimizer and the RNG of every process
                       (torch files that accelerate reads back with weights_only=True: plain tensors only)
  scheduler.json       the LR schedule's state (JSON: nothing in a checkpoint is unpickled as code)
  drafter/             the drafter in the native format (model.safetensors + config.json)
  recipe.yaml          the resolved recipe
  trainer_state.json   step, data position, best metric, logged history
  MANIFEST.json        every file above with its size and sha256, checked before a resume
  COMPLETE             written last, inside the temporary folder, before the rename
It is built in `step_000500.tmp/` and renamed into place (core/folders.py), so a crash leaves either
a complete checkpoint or a `.tmp` folder that resume skips (and the next save of that step replaces).
A complete checkpoint whose files no longer match its manifest (truncated, deleted, replaced) is
skipped with a warning, and resume falls back to the newest intact one. The names of a run
folder's parts are core/run_folder.py's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256, publish, staging_folder, staging_path
from draftheads.core.run_folder import COMPLETE, DRAFTER, RECIPE_FILE, STATE_FILE, list_checkpoints, step_dir
from draftheads.core.state_files import DamagedFile, read_json, read_yaml
from draftheads.heads.factory import upgrade_head
from draftheads.interop.native import save_drafter

SCHEDULER_FILE = "scheduler.json"
MANIFEST_FILE = "MANIFEST.json"
# a checkpoint written before manifests (nothing vouched for its files) whose state files are damaged
CHECKPOINT_FIX = "delete that checkpoint to resume from an earlier one, or set train.resume=never"


# ---- writing ----------------------------------------------------------------------------------


def save_checkpoint(accelerator, run_dir: Path, step: int, drafter, state: dict, recipe_dict: dict, scheduler,
                    target=None) -> Path:
    """Write step_NNNNNN/ atomically. Every process must call this (save_state stores each one's RNG)."""
    final = step_dir(run_dir, step)
    tmp = staging_path(final)
    if accelerator.is_main_process:
        staging_folder(final)  # removes what a crash during an earlier save of this step left
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()  # every process's RNG file is on disk before the manifest lists them
    if accelerator.is_main_process:
        save_drafter(drafter, tmp / DRAFTER, target=target, extra={"step": step}, recipe=recipe_dict)
        write_recipe(tmp / RECIPE_FILE, recipe_dict)
        write_json(tmp / STATE_FILE, state)
        write_json(tmp / SCHEDULER_FILE, scheduler.state_dict())
        write_json(tmp / MANIFEST_FILE, {"files": manifest(tmp)})
        (tmp / COMPLETE).write_text(f"step {step}\n")
        publish(tmp, final)
    accelerator.wait_for_everyone()
    return final


def manifest(folder: Path) -> dict[str, dict]:
    """Relative path -> {size, sha256} of every file under `folder`."""
    return {str(path.relative_to(folder)): {"size": path.stat().st_size, "sha256": file_sha256(path)}
            for path in sorted(Path(folder).rglob("*")) if path.is_file()}


def write_recipe(path: Path, recipe_dict: dict) -> None:
    """The resolved recipe as YAML that `load_recipe` reads back (derived values go in a comment)."""
    data = {k: v for k, v in recipe_dict.items() if k != "derived"}
    derived = recipe_dict.get("derived", {})
    header = "# resolved recipe of this run; derived from the target: " + ", ".join(f"{k}={v}"
                                                                                    for k, v in derived.items())
    Path(path).write_text(header + "\n" + yaml.safe_dump(data, sort_keys=False))


def write_json(path: Path, data: dict) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


# ---- finding and reading ----------------------------------------------------------------------


def damage(folder: Path) -> str | None:
    """What is wrong with a complete checkpoint's files against its manifest (None: intact).

    Checkpoints written before manifests existed cannot be checked and count as intact, unless they hold
    a pickled object accelerate would unpickle as code (their LR scheduler was saved that way)."""
    pickled = sorted(p.name for p in Path(folder).glob("custom_checkpoint_*.pkl"))
    if pickled:
        return (f"it holds {pickled[0]}, a pickled object draftheads does not load (unpickling can run code); delete "
                "that file to resume from this checkpoint (the LR schedule is replayed from the step)")
    listed = Path(folder) / MANIFEST_FILE
    if not listed.is_file():
        return None
    try:
        files = read_json(listed, MANIFEST_FILE, CHECKPOINT_FIX, required=("files",))["files"]
    except DamagedFile as e:   # the caller says what to do about the checkpoint
        return f"{MANIFEST_FILE} is damaged ({e.problem})"
    if not isinstance(files, dict):
        return f"{MANIFEST_FILE} is damaged (its files are not a mapping)"
    for name, expected in files.items():
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != expected["size"]:
            return f"{name} has {path.stat().st_size:,} bytes where {expected['size']:,} were written"
        if file_sha256(path) != expected["sha256"]:
            return f"{name} was changed after it was written"
    return None


def find_resume(run_dir: Path, resume: str, warn=print) -> Path | None:
    """The checkpoint to resume from: 'auto' = the newest intact one (None if there is no checkpoint),
    'never' = None, else that folder. Damaged checkpoints are skipped with a one-line `warn`."""
    if resume == "never":
        return None
    if resume != "auto":
        return explicit_checkpoint(Path(resume))
    done = list_checkpoints(run_dir)
    newest = None
    for folder in reversed(done):
        problem = damage(folder)
        if problem is None:
            return folder
        newest = newest or f"{folder.name}: {problem}"
        warn(f"draftheads: skipping damaged checkpoint {folder}: {problem}")
    if done:
        raise DraftheadsError(f"no intact checkpoint in {run_dir} (all {len(done)} are damaged, the newest as "
                              f"{newest}); set train.resume=never to train from the start, or train.output_dir to a "
                              "new run folder")
    return None


def explicit_checkpoint(folder: Path) -> Path:
    if not folder.is_dir():
        raise DraftheadsError(f"train.resume: checkpoint '{folder}' not found; use auto, never, or a "
                              "step_NNNNNN folder")
    if not (folder / COMPLETE).is_file():
        raise DraftheadsError(f"train.resume: '{folder}' is a half-written checkpoint (no {COMPLETE} marker); pick an "
                              "earlier one")
    problem = damage(folder)
    if problem:
        raise DraftheadsError(f"train.resume: checkpoint '{folder}' is damaged ({problem}); pick another one")
    return folder


def load_checkpoint(accelerator, folder: Path, scheduler) -> dict:
    """Restore weights, optimizer, RNG and the LR schedule from `folder`; return its trainer state."""
    folder = Path(folder)
    try:
        accelerator.load_state(str(folder))
    except Exception as e:  # noqa: BLE001 - torch and accelerate raise many types for a file they cannot use
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DraftheadsError(f"checkpoint {folder} does not fit this run's drafter and optimizer ({first}); resume it "
                              "with the settings it was trained with, or set train.output_dir to a new "
                              "run folder") from None
    state = read_json(folder / STATE_FILE, "trainer state", CHECKPOINT_FIX, required=("step",))
    if (folder / SCHEDULER_FILE).is_file():
        scheduler.load_state_dict(read_json(folder / SCHEDULER_FILE, "LR schedule state", CHECKPOINT_FIX))
    else:  # written before scheduler.json: the schedule is a function of the step, so replay it
        for _ in range(state["step"]):
            scheduler.step()
    return state


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


# ---- what a resumed run may change ------------------------------------------------------------

# Settings that do not change what the training steps compute (where they are saved, how often they are
# logged or evaluated, how long the run may take): a resumed run may differ in these, and in nothing else.
FREE = {
    "name": None, "log": None, "eval": None, "derived": None,
    "target": {"device", "attn_implementation", "chat_template"},
    "head": {"init_from"},
    "data": {"output", "batch_size", "concurrency", "max_retries", "openai_url", "openai_model", "backend"},
    "train": {"output_dir", "resume", "time_budget_minutes", "log_every", "eval_every", "save_every", "keep_last",
              "feature_cache", "shard_target"},
}


def changed_settings(saved: dict, current: dict, defaults: dict | None = None) -> list[str]:
    """'section.key: old -> new' for every setting that changes the result and differs. A key the saved recipe
    lacks is a setting added to draftheads after the run was saved: it compares as its default (`defaults`:
    section -> key -> default), so runs saved by an older version resume as long as the new setting is left alone."""
    defaults = defaults or {}
    out = []
    for section in sorted(set(saved) | set(current)):
        if section in FREE and FREE[section] is None:
            continue
        old, new = saved.get(section) or {}, current.get(section) or {}
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new:
                out.append(f"{section}: {old!r} -> {new!r}")
            continue
        if section == "head" and old.get("type") != new.get("type"):  # another kind of head: its keys differ anyway
            out.append(f"head.type: {old.get('type')!r} -> {new.get('type')!r}")
            continue
        for key in sorted(set(old) | set(new)):
            before = old[key] if key in old else (defaults.get(section) or {}).get(key)
            if key not in FREE.get(section, set()) and before != new.get(key):
                out.append(f"{section}.{key}: {before!r} -> {new.get(key)!r}")
    return out


def check_same_settings(folder: Path, recipe_dict: dict, defaults: dict | None = None) -> None:
    """Refuse to resume `folder` automatically under settings that change the result (`defaults`: see
    changed_settings; `Recipe.defaults()` gives them)."""
    path = Path(folder) / RECIPE_FILE
    if not path.is_file():
        return
    saved = read_yaml(path, "recipe copy", CHECKPOINT_FIX)
    if isinstance(saved.get("head"), dict):   # saved before EAGLE-3 and Medusa-2 were head types of their own
        saved["head"] = upgrade_head(saved["head"])[0]
    diff = changed_settings(saved, {k: v for k, v in recipe_dict.items() if k != "derived"}, defaults)
    if diff:
        shown = "; ".join(diff[:4]) + (f"; and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise DraftheadsError(f"{folder.parent} was trained with other settings ({shown}); set train.output_dir to "
                              f"start a new run, or train.resume={folder} to continue this one with the new settings")
