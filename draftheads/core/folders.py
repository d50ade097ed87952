"""Writing a folder atomically: fill a staging sibling, flush it, swap it in for the folder it replaces.

Readers only ever see the old folder or the complete new one, and nothing is removed that this
module did not put there:
- `write_folder` stages in a fresh hidden sibling `.NAME.tmp-XXXX/` (a crash leaves it behind, hidden,
  never mistaken for anything else);
- checkpoints stage in `NAME.tmp/` (`staging_folder`), a name every training process agrees on and
  that lives inside the run folder, where a leftover is a half-written checkpoint of that run;
- `publish` moves the folder being replaced aside to a fresh hidden name and removes it last.

    write_folder(out, lambda tmp: (tmp / "config.json").write_text(...))
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable


def staging_path(final: Path) -> Path:
    """Where a checkpoint `final` is built before it is published: its sibling NAME.tmp."""
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
    """Flush tmp's files to disk, then rename it to `final` (an existing `final` is moved aside, removed last)."""
    tmp, final = Path(tmp), Path(final)
    flush_files(tmp)
    aside = None
    if final.exists():
        aside = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(final, aside)
    os.replace(tmp, final)
    if aside is not None:
        shutil.rmtree(aside)
    return final


def write_folder(final: Path, fill: Callable[[Path], object]) -> Path:
    """Build `final` with fill(tmp) in a fresh staging sibling, then publish it; returns `final`.

    If fill fails, the staging folder is removed and `final` is left as it was."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the published folder gets the usual permissions
    try:
        fill(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish(tmp, final)


def write_file_atomic(final: Path, fill: Callable[[Path], object]) -> Path:
    """One file the same way: fill(tmp) writes a hidden sibling `.NAME.tmp-XXXX`, flushed, then renamed to `final`;
    if fill fails, the sibling is removed and `final` left as it was."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.tmp-")
    os.close(handle)
    tmp = Path(name)
    try:
        fill(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final)
    return final


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def flush_files(folder: Path) -> None:
    """fsync every file under `folder`: a power cut after the rename must not publish empty files."""
    for path in Path(folder).rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def link_or_copy(src, dst) -> None:
    """`dst` as a hard link to `src` (no bytes copied: for files of a model folder written again beside it), or a
    copy where the file system has no links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
