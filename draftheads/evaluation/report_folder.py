"""Where an evaluation's report goes: --out (a new or empty folder, or an earlier report's), else a timestamped
folder inside the first run folder given, else under runs/; checked before minutes of work, not after."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.evaluation.drafter_specs import split_spec


def check_report_folder(out: str | None) -> None:
    """--out must be a new or empty folder, or an earlier report's (whose files are replaced), somewhere writable."""
    if out is None:
        return  # a new timestamped folder
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DraftheadsError(f"--out {out} is a file; give a folder for the report")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "report.json").is_file():
        raise DraftheadsError(f"--out {out} is not empty and holds no earlier report; give a new or empty folder")
    parent = next(p for p in [folder.absolute(), *folder.absolute().parents] if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise DraftheadsError(f"cannot write the report to --out {out}: {parent} is not a writable folder; choose "
                              "another place")


def report_folder(out: str | None, drafters: list[str]) -> Path:
    """--out, else eval-<timestamp>/ inside the first run folder given, else under runs/."""
    if out:
        return Path(out)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for spec in drafters:
        path = Path(split_spec(spec)[0])
        if path.is_dir() and (path / "final").is_dir():
            return path / f"eval-{stamp}"
    return Path("runs") / f"eval-{stamp}"
