"""Export never removes what it did not write: refused --out folders keep every file, in one-line errors."""

import json

import pytest

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter


@pytest.fixture
def run(tmp_path, llama_target):
    """runs/R with two complete checkpoints, best/ and final/, like a finished training run."""
    run = tmp_path / "runs" / "R"
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2, lm_head="own")  # no target needed to export
    for where in ("step_000010", "step_000020", "best", "final"):
        save_drafter(drafter, run / where / "drafter", target=llama_target)
    for step in ("step_000010", "step_000020"):
        (run / step / "COMPLETE").write_text("")
        (run / step / "trainer_state.json").write_text("{}")
    return run


def snapshot(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def refused(run, out, match, fmt="vllm", **kw):
    before = snapshot(run.parent.parent)
    with pytest.raises(DraftheadsError, match=match) as info:
        export_drafter(run, fmt, out, **kw)
    assert "\n" not in str(info.value)
    assert snapshot(run.parent.parent) == before  # nothing removed, nothing half-written
    return str(info.value)


def test_the_run_folder_and_folders_around_the_drafter_are_refused(run):
    refused(run, run, "holds or lies inside the drafter", overwrite=True)
    refused(run, run / "final", "holds or lies inside the drafter", overwrite=True)
    refused(run, run / "final" / "drafter" / "sub", "holds or lies inside the drafter")
    refused(run, run.parent, "holds or lies inside the drafter", overwrite=True)


def test_other_runs_and_data_folders_are_refused(run, tmp_path):
    other = tmp_path / "runs" / "other"
    (other / "step_000001").mkdir(parents=True)
    refused(run, other, "holds training checkpoints, drafters or data", overwrite=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "draftheads_data.json").write_text("{}")
    refused(run, data, "a run or data folder", overwrite=True)


def test_a_users_folder_keeps_its_files(run, tmp_path):
    mine = tmp_path / "runs" / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    refused(run, mine, "not empty and is not a draftheads export", overwrite=True)
    assert (mine / "notes.txt").read_text() == "keep me"
    card = tmp_path / "runs" / "card"   # a model card alone is no export of ours: the export record makes one
    card.mkdir()
    (card / "README.md").write_text("---\nlicense: mit\n---\n")
    refused(run, card, "not empty and is not a draftheads export", overwrite=True)
    (tmp_path / "runs" / "afile").write_text("x")
    refused(run, tmp_path / "runs" / "afile", "is a file")
    refused(run, tmp_path / "runs" / "afile" / "below", "not a writable folder")


def test_a_previous_export_is_replaced_only_with_overwrite_and_only_by_the_same_format(run, tmp_path):
    out = tmp_path / "runs" / "exported"
    export_drafter(run, "vllm", out)
    assert (out / "README.md").is_file()   # its model card is part of it
    refused(run, out, "previous 'vllm' export; pass --overwrite")
    refused(run, out, "previous 'vllm' export, not 'tgi'", fmt="tgi", overwrite=True)
    (out / "config.json").write_text("{}")  # replaced, not merged: the export is whole again
    export_drafter(run, "vllm", out, overwrite=True)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MedusaModel"]
    native = tmp_path / "runs" / "copy"
    export_drafter(run, "native", native)
    export_drafter(run, "native", native, overwrite=True)  # a native copy is a previous export too
    assert json.loads((native / "draftheads_export.json").read_text())["format"] == "native"


def test_folders_beside_out_are_never_touched(run, tmp_path):
    out = tmp_path / "runs" / "exported"
    for name in ("exported.tmp", "exported.old", ".exported.old"):
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "mine.txt").write_text("keep")
    export_drafter(run, "vllm", out)
    export_drafter(run, "vllm", out, overwrite=True)
    for name in ("exported.tmp", "exported.old", ".exported.old"):
        assert (tmp_path / "runs" / name / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [".exported.old", "R", "exported", "exported.old",
                                                                     "exported.tmp"]


def test_a_drafter_of_the_embedded_target_exports_offline(tmp_path, monkeypatch, tiny_target_dir):
    """The drafter records target 'smollm2-135m': export resolves it like load_target does, from the cache,
    with the hub unreachable (before, it asked the hub for smollm2-135m/config.json)."""
    import shutil

    from draftheads.core.folders import file_sha256
    from draftheads.core.targets import ALIASES, COMPLETE

    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cached = tmp_path / "cache" / "smollm2-135m"
    shutil.copytree(tiny_target_dir, cached)
    pinned = ALIASES["smollm2-135m"]
    (cached / COMPLETE).write_text(json.dumps({"requirement": pinned.requirement, "wheel_sha256": pinned.wheel_sha256,
                                               "files": {p.name: file_sha256(p) for p in cached.iterdir()
                                                         if p.is_file()}}))
    target, _ = draftheads.load_target("smollm2-135m", dtype="fp32", device="cpu")
    for kind, fmt in (("eagle", "sglang"), ("medusa", "vllm")):  # the layer config, and the shared lm_head's weights
        native = save_drafter(draftheads.build_drafter(kind, target), tmp_path / f"{kind}-native", target=target)
        assert json.loads((native / "config.json").read_text())["target"]["name"] == "smollm2-135m"
        out = export_drafter(native, fmt, tmp_path / f"{kind}-{fmt}")
        assert (out / "config.json").is_file()


def test_a_read_only_destination_is_refused_before_any_work(run, tmp_path, monkeypatch):
    """As root every folder is writable, so the read-only case is simulated: the check runs before the export."""
    import os

    from draftheads.evaluation.report_folder import check_report_folder

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    refused(run, tmp_path / "runs" / "new", "not a writable folder")
    with pytest.raises(DraftheadsError, match="not a writable folder"):
        check_report_folder(str(tmp_path / "report"))
