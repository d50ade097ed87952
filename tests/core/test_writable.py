"""check_writable: an output location that cannot be created and written is refused in one line, before any work.

These tests run as root in CI and in the sandbox, where permissions stop no write: the cases that fail for
everyone (a path under a regular file, a dangling link) are real; a read-only folder is simulated by os.access
saying no, and a read-only mount by the probe's create failing; the one real chmod test is skipped as root.
"""

import errno
import os
import tempfile

import pytest

from draftheads.core import writable
from draftheads.core.errors import DraftheadsError
from draftheads.core.writable import PROBE_PREFIX, check_writable


def refused(path, match, **kw):
    with pytest.raises(DraftheadsError, match=match) as info:
        check_writable(path, kw.pop("what", "train.output_dir"), **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_new_folder_anywhere_below_a_writable_one_passes_and_leaves_no_trace(tmp_path):
    (tmp_path / "old").write_text("x")
    stamp = os.stat(tmp_path).st_mtime_ns
    assert check_writable(tmp_path / "runs" / "new", "train.output_dir") == tmp_path / "runs" / "new"
    assert check_writable(tmp_path, "train.output_dir") == tmp_path  # an existing folder, written inside
    assert [p.name for p in tmp_path.iterdir()] == ["old"]  # the probe removed itself; nothing was created
    assert os.stat(tmp_path).st_mtime_ns == stamp  # and the folder's times are as they were


def test_a_path_under_a_regular_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    message = refused(tmp_path / "afile" / "run", "is a file, not a writable folder")
    assert str(tmp_path / "afile") in message and "set train.output_dir to" in message
    refused(tmp_path / "afile" / "a" / "b", "afile is a file", what="--out", published=True)
    refused(tmp_path / "afile" / "x.gguf", "give --out a place you can write", what="--out", file=True)


def test_an_output_of_the_wrong_kind_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    refused(tmp_path / "afile", "is a file; set data.output to a folder", what="data.output")
    refused(tmp_path, "is a folder; give --out a file name", what="--out", file=True)
    check_writable(tmp_path / "afile", "--out", file=True)  # a file output replaces an existing file


def test_a_dangling_link_on_the_way_is_refused(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    refused(tmp_path / "gone" / "run", "gone is a broken link or special file, not a writable folder")


def test_a_folder_without_write_permission_is_refused(tmp_path, monkeypatch):
    """Simulated: as root, os.access says yes to every folder."""
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != os.fspath(locked))
    message = refused(locked / "run", "not a writable folder \\(permission denied\\)")
    assert message.startswith(f"cannot write train.output_dir {locked / 'run'}: {locked} is")
    check_writable(tmp_path / "elsewhere", "train.output_dir")


def test_published_folders_and_files_need_their_parent_writable(tmp_path, monkeypatch):
    """Built beside the output and renamed in: an existing output folder is not enough, its parent must take files."""
    out = tmp_path / "export"
    out.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != os.fspath(tmp_path))
    check_writable(out, "--out")  # written inside: fine
    refused(out, "not a writable folder", what="--out", published=True)
    refused(tmp_path / "model.gguf", "not a writable folder", what="--out", file=True)


def test_the_probe_sees_what_os_access_cannot(tmp_path, monkeypatch):
    """A read-only mount, root squash, an immutable folder: os.access says yes, creating a file fails."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    refused(tmp_path / "run", f"not a writable folder \\({os.strerror(errno.EROFS)}\\)")


def test_the_probe_removes_only_its_own_file(tmp_path):
    neighbour = tmp_path / f"{PROBE_PREFIX}mine"
    neighbour.write_text("keep")
    writable.probe(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [neighbour.name] and neighbour.read_text() == "keep"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; simulated above instead")
def test_a_really_read_only_folder_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        refused(locked / "run", "not a writable folder")
    finally:
        locked.chmod(0o755)
