"""Can a command write where it was told to? Asked before any work, so a bad place costs seconds, not a training run.

    check_writable(recipe.run_dir, "train.output_dir")                 # written inside (created if missing)
    check_writable(out, "--out", published=True)                       # built beside, renamed in (core/folders.py)
    check_writable(out, "--out", file=True)                            # one file, written beside and renamed in

The walk goes up from the output to the nearest thing that exists: it must be a folder (a path under a regular file
can never be created, not even by root), and that folder must take a new file. os.access answers for permissions;
a probe file, created and removed at once, answers for what it cannot see (read-only mounts, root-squashed NFS,
immutable folders). The probe removes only the file it created and puts the folder's times back, so a command
refused later for another reason still leaves everything as it found it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from draftheads.core.errors import DraftheadsError

PROBE_PREFIX = ".draftheads-probe-"


def check_writable(path, what: str, *, file: bool = False, published: bool = False) -> Path:
    """Refuse in one line an output `path` (named `what` in the message: a setting or a flag) that cannot be created
    and written. `file`: the output is a file; `published`: a folder built beside it and renamed into place, so its
    parent must take new entries. Returns the path, absolute."""
    path = Path(path).expanduser().absolute()
    if not file and os.path.lexists(path) and not path.is_dir():
        raise DraftheadsError(f"{what} {path} is a file; {fix(what, 'a folder')}")
    if file and path.is_dir():
        raise DraftheadsError(f"{what} {path} is a folder; {fix(what, 'a file name')}")
    folder = nearest_existing(path.parent if file or published else path)
    if not folder.is_dir():
        kind = "a file" if folder.is_file() else "a broken link or special file"
        raise DraftheadsError(f"cannot write {what} {path}: {folder} is {kind}, not a writable folder; "
                              f"{fix(what, 'a place you can write')}")
    problem = unwritable(folder)
    if problem:
        raise DraftheadsError(f"cannot write {what} {path}: {folder} is not a writable folder ({problem}); "
                              f"{fix(what, 'a place you can write')}")
    return path


def fix(what: str, thing: str) -> str:
    """The fix, in the words of where the path came from: a flag is given, a setting is set."""
    return f"give {what} {thing}" if what.startswith("-") else f"set {what} to {thing}"


def nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (a dangling link counts: creating through it fails too)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def unwritable(folder: Path) -> str | None:
    """Why a new file cannot be made in `folder`; None when it can."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:
        probe(folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def probe(folder: Path) -> None:
    """Create and remove one empty file in `folder`, then put the folder's access and modification times back."""
    before = os.stat(folder)
    handle, name = tempfile.mkstemp(dir=folder, prefix=PROBE_PREFIX)
    os.close(handle)
    os.unlink(name)
    try:
        os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
    except OSError:
        pass  # a folder we may write but do not own: its times moved, nothing else did
