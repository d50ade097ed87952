"""What resume trusts: nothing in a checkpoint runs as code, damaged checkpoints are skipped for the newest
intact one, and a run folder is not continued under settings that change the result."""

import json
import pickle

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.training import checkpoint as C
from draftheads.training.loop import run_training
from tests.training.train_helpers import Crash, crash_at, max_weight_diff, tiny_recipe


class Payload:
    """Unpickling this writes a file: proof that a checkpoint ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


SETTINGS = dict(max_steps=6, save_every=2, eval_every=2, keep_last=3)


def interrupted_run(data_dir, run_dir, target, at=4):
    with pytest.raises(Crash):
        run_training(tiny_recipe(data_dir, run_dir, **SETTINGS), target=target, after_step=crash_at(at))
    return run_dir


def resume(data_dir, run_dir, target, **train):
    return run_training(tiny_recipe(data_dir, run_dir, **{**SETTINGS, **train}), target=target)


def test_checkpoints_hold_no_pickled_objects_and_a_manifest(tmp_path, data_dir, llama_target):
    run = interrupted_run(data_dir, tmp_path / "run", llama_target)
    step = run / "step_000004"
    assert not list(step.glob("custom_checkpoint_*"))  # the scheduler went to JSON, not to accelerate's pickle
    assert json.loads((step / C.SCHEDULER_FILE).read_text())["last_epoch"] == 4
    files = json.loads((step / C.MANIFEST_FILE).read_text())["files"]
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.json",
            "drafter/model.safetensors"} <= set(files)


@pytest.mark.parametrize("planted", ["custom_checkpoint_0.pkl", "optimizer.bin", "random_states_0.pkl"])
@pytest.mark.parametrize("manifest", ["kept", "forged"])
def test_a_pickle_payload_in_a_checkpoint_never_runs(tmp_path, data_dir, llama_target, planted, manifest):
    run = interrupted_run(data_dir, tmp_path / "run", llama_target)
    marker = tmp_path / "pwned"
    for step in C.list_checkpoints(run):  # every checkpoint, so no intact one is left to fall back to
        (step / planted).write_bytes(pickle.dumps(Payload(marker)))
        if manifest == "forged":  # whoever planted it also rewrote the manifest
            (step / C.MANIFEST_FILE).write_text(json.dumps({"files": C.manifest(step)}))
    try:
        resume(data_dir, run, llama_target)
    except DraftheadsError as e:  # refused in one line: damaged, or not plain tensors
        assert "\n" not in str(e)
    assert not marker.exists()


def test_a_damaged_checkpoint_is_skipped_for_the_newest_intact_one(tmp_path, data_dir, llama_target, capsys):
    straight = run_training(tiny_recipe(data_dir, tmp_path / "straight", **SETTINGS), target=llama_target)
    run = interrupted_run(data_dir, tmp_path / "run", llama_target, at=5)
    weights = run / "step_000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated, yet marked complete
    capsys.readouterr()
    resumed = resume(data_dir, run, llama_target)
    out = capsys.readouterr().out
    assert "skipping damaged checkpoint" in out and "step_000004: model.safetensors has 100 bytes" in out
    assert "resuming from" in out and "step_000002" in out
    assert max_weight_diff(straight / "final" / "drafter", resumed / "final" / "drafter") <= 1e-6


def test_no_intact_checkpoint_is_a_one_line_error(tmp_path, data_dir, llama_target):
    run = interrupted_run(data_dir, tmp_path / "run", llama_target)
    for step in C.list_checkpoints(run):
        (step / "optimizer.bin").unlink()
    with pytest.raises(DraftheadsError, match="no intact checkpoint") as info:
        resume(data_dir, run, llama_target)
    assert "\n" not in str(info.value) and "train.resume=never" in str(info.value)
    with pytest.raises(DraftheadsError, match="optimizer.bin is missing"):
        C.find_resume(run, str(run / "step_000004"))


def test_changed_settings_are_refused_with_the_difference(tmp_path, data_dir, llama_target):
    run = interrupted_run(data_dir, tmp_path / "run", llama_target)
    with pytest.raises(DraftheadsError) as info:
        resume(data_dir, run, llama_target, lr=1e-2, seed=5)
    message = str(info.value)
    assert "train.lr: 0.003 -> 0.01" in message and "train.seed: 0 -> 5" in message and "\n" not in message
    assert "train.output_dir" in message and f"train.resume={run / 'step_000004'}" in message
    with pytest.raises(DraftheadsError, match="head.type: 'medusa' -> 'mtp'"):
        run_training(tiny_recipe(data_dir, run, {"type": "mtp", "depth": 2}, **SETTINGS), target=llama_target)
    # what does not change the result may change: logging, evaluation, the time budget
    resume(data_dir, run, llama_target, log_every=1, eval_every=3, time_budget_minutes=60)
    assert json.loads((run / "final" / "metrics.json").read_text())["steps"] == 6


def test_a_run_saved_before_a_setting_existed_resumes_while_that_setting_keeps_its_default(tmp_path, data_dir,
                                                                                           llama_target):
    """A recipe saved by an older draftheads lacks the settings added since (train.more_data, say): they compare as
    their defaults, so `make demo` or `draftheads train` run again on an older run folder continue it."""
    import yaml

    run = interrupted_run(data_dir, tmp_path / "run", llama_target)
    for step in C.list_checkpoints(run):   # as an older version wrote them
        saved = yaml.safe_load((step / C.RECIPE_FILE).read_text())
        del saved["train"]["more_data"], saved["train"]["seed"]
        (step / C.RECIPE_FILE).write_text(yaml.safe_dump(saved))
        (step / C.MANIFEST_FILE).unlink()
        (step / C.MANIFEST_FILE).write_text(json.dumps({"files": C.manifest(step)}))
    with pytest.raises(DraftheadsError, match=r"train\.seed: 0 -> 5"):   # a missing setting set to a new value
        resume(data_dir, run, llama_target, seed=5)
    resume(data_dir, run, llama_target)
    assert json.loads((run / "final" / "metrics.json").read_text())["steps"] == 6


def test_a_finished_run_says_so_and_trains_nothing(tmp_path, data_dir, llama_target, capsys):
    run = resume(data_dir, tmp_path / "run", llama_target)
    before = (run / "final" / "drafter" / "model.safetensors").stat().st_mtime_ns
    steps = []
    capsys.readouterr()
    run_training(tiny_recipe(data_dir, run, **SETTINGS), target=llama_target, after_step=steps.append)
    assert steps == [] and "has finished (6 of 6 steps" in capsys.readouterr().out
    assert (run / "final" / "drafter" / "model.safetensors").stat().st_mtime_ns == before
