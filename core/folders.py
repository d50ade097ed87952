"""Writing a folder atomically: fill a sibling `NAME.tmp/`, flush it, swap it in for `NAME/`.

Readers only ever see the old folder or the complete new one. A crash leaves `NAME.tmp/` behind
(the next write of NAME replaces it) or, between the two renames, `NAME.old/`. Checkpoints, the
best/ and final/ drafters, native drafters and engine exports are all written this way.

    write_folder(out, lambda tmp: (tmp / "config.json").write_text(...))
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable


def staging_path(final: Path) -> Path:
    """Where `final` is built before it is published: its sibling NAME.tmp."""
    final = Path(final)
    return final.with_name(final.name + ".tmp")


def staging_folder(final: Path) -> Path:
    """staging_path(final), with what a crashed write left there removed (the folder itself is not created)."""
    tmp = staging_path(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    return tmp


def publish(tmp: Path, final: Path) -> Path:
    """Flush tmp's files to disk, then rename it to `final` (an existing `final` is removed last)."""
    tmp, final = Path(tmp), Path(final)
    flush_files(tmp)
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)
    return final


def write_folder(final: Path, fill: Callable[[Path], object]) -> Path:
    """Build `final` with fill(tmp) in a staging folder, then publish it; returns `final`."""
    tmp = staging_folder(final)
    tmp.mkdir()
    fill(tmp)
    return publish(tmp, final)


def flush_files(folder: Path) -> None:
    """fsync every file under `folder`: a power cut after the rename must not publish empty files."""
    for path in Path(folder).rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
