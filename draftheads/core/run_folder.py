"""The layout of a training run on disk, shared by what writes it (training/) and what reads it.

    runs/<name>/
        step_000500/         a checkpoint, complete once COMPLETE and trainer_state.json are in it
            drafter/         the drafter at that step (native format, interop/native.py)
            recipe.yaml      the resolved recipe
        best/drafter/        the best drafter so far (by simulated acceptance length)
        final/drafter/       the drafter after the last step
        eval-<time>/         a `draftheads eval` of it: report.json, report.md (where no --out is given)
"""

from __future__ import annotations

import re
from pathlib import Path

from draftheads.core.state_files import read_yaml

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.json"
RECIPE_FILE = "recipe.yaml"
DRAFTER = "drafter"
FINAL = "final"
BEST = "best"
STEP_RE = re.compile(r"^step_(\d{6,})$")
EVAL_PREFIX = "eval-"   # + a sortable timestamp: an evaluation's report folder (evaluation/report_folder.py)
DATA_MARKER = "draftheads_data.json"  # what makes a folder a `draftheads data` folder (data/datastore.py)


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


def drafter_candidates(run_dir: Path) -> list[Path]:
    """Where a run keeps drafters, in the order a reader prefers them: final/, then the newest checkpoint's."""
    run_dir = Path(run_dir)
    return [run_dir / FINAL / DRAFTER] + [step / DRAFTER for step in reversed(list_checkpoints(run_dir))]


def run_recipe(folder: Path) -> dict | None:
    """The resolved recipe saved with the run that produced this drafter (newest checkpoint's copy)."""
    run = folder.resolve().parent.parent
    copies = sorted(run.glob(f"step_*/{RECIPE_FILE}"))
    if not copies:
        return None
    return read_yaml(copies[-1], "run recipe copy", f"copy {RECIPE_FILE} over it from another checkpoint of the run "
                     "(or from the recipe it was trained with), or train again")
