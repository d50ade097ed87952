"""Where an evaluation's report goes: --out (a new or empty folder, or an earlier report's), else a timestamped
folder inside the first run folder given, else under runs/; checked before minutes of work, not after."""

from __future__ import annotations

import datetime
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import EVAL_PREFIX
from draftheads.core.writable import check_writable
from draftheads.measurement.drafter_specs import split_spec


def check_report_folder(out: str | None, drafters: list[str] = ()) -> None:
    """--out must be a new or empty folder, or an earlier report's (whose files are replaced), somewhere writable;
    without --out, the place report_folder picks must take a new folder."""
    if out is None:
        check_writable(report_folder(None, list(drafters)), "--out")
        return
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DraftheadsError(f"--out {out} is a file; give a folder for the report")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "report.json").is_file():
        raise DraftheadsError(f"--out {out} is not empty and holds no earlier report; give a new or empty folder")
    check_writable(folder, "--out")


def report_folder(out: str | None, drafters: list[str]) -> Path:
    """--out, else eval-<timestamp>/ inside the first run folder given, else under runs/."""
    if out:
        return Path(out)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for spec in drafters:
        path = Path(split_spec(spec)[0])
        if path.is_dir() and (path / "final").is_dir():
            return path / f"{EVAL_PREFIX}{stamp}"
    return Path("runs") / f"{EVAL_PREFIX}{stamp}"
