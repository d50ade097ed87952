"""Checkpoints: resume equals a straight run, half-written checkpoints are skipped, keep_last keeps the best."""

import json

import pytest
import torch

from draftheads.core import run_folder as R
from draftheads.core.errors import DraftheadsError
from draftheads.recipe import load_recipe
from draftheads.training import checkpoint as C
from draftheads.training import loop
from draftheads.training.loop import run_training
from tests.training.train_helpers import Crash, NoisyDrafter, crash_at, max_weight_diff, tiny_recipe


def noisy(target):
    torch.manual_seed(0)
    return NoisyDrafter(target.config.hidden_size, target.config.vocab_size)


HEADS = {
    "noisy": None,  # the test double: its input noise needs RNG restored exactly
    "medusa": {"type": "medusa", "num_heads": 2},
    "eagle": {"type": "eagle", "input_noise": 0.2},  # noise from the global RNG, like the double
    "mtp": {"type": "mtp", "depth": 2},
    "dflash": {"type": "dflash", "block_size": 4},  # anchors drawn from the global RNG each step
    "peagle": {"type": "peagle", "depths": 3},  # COD slots drawn from the global RNG each step
    "dspark": {"type": "dspark", "block_size": 3, "markov_rank": 8},  # anchors as DFlash's
    # every training choice of issue 54 at once: head.init and head.ttt_mode live in the head's config
    "eagle3-lk": {"type": "eagle3", "ttt_steps": 2, "draft_vocab_size": 128, "init": "target_layer",
                  "ttt_mode": "harmonised"},
}
# train.* settings a case adds: the objective is the recipe's, restored with it on resume
OBJECTIVES = {"eagle3-lk": {"loss": "lk_lambda", "depth_weights": "reach"}}


@pytest.mark.parametrize("head", list(HEADS))
def test_resume_matches_a_straight_run(tmp_path, data_dir, llama_target, head):
    """6 steps straight == 3 steps, crash, resume for 3: same weights and the same logged losses.

    19 training rows in batches of 4 with grad_accum 2 make 2 steps per epoch, so step 3 ends in the
    middle of epoch 1; log_every 2 puts it inside a logging window. The data position and the
    partial window must be restored, and (for the noisy double) the RNG too.
    """
    settings = dict(max_steps=6, save_every=3, log_every=2, eval_every=3, grad_accum=2, batch_size=4)

    def train(run_dir, **kw):
        recipe = tiny_recipe(data_dir, run_dir, HEADS[head], **settings, **OBJECTIVES.get(head, {}))
        drafter = noisy(llama_target) if head == "noisy" else None
        return run_training(recipe, target=llama_target, drafter=drafter, **kw)

    straight = train(tmp_path / "straight")
    with pytest.raises(Crash):
        train(tmp_path / "resumed", after_step=crash_at(3))
    assert not (tmp_path / "resumed" / "final").exists()
    steps_after_resume = []
    resumed = train(tmp_path / "resumed", after_step=steps_after_resume.append)
    assert steps_after_resume == [4, 5, 6]  # it continued; it did not start over
    saved = load_recipe(str(resumed / "step_000006" / "recipe.yaml")).train
    wanted = OBJECTIVES.get(head, {})
    assert (saved.loss, saved.depth_weights) == (wanted.get("loss"), wanted.get("depth_weights"))

    assert max_weight_diff(straight / "final" / "drafter", resumed / "final" / "drafter") <= 1e-6
    a = json.loads((straight / "final" / "metrics.json").read_text())
    b = json.loads((resumed / "final" / "metrics.json").read_text())
    assert [h["step"] for h in a["history"]] == [2, 4, 6]
    assert [h["loss"] for h in a["history"]] == pytest.approx([h["loss"] for h in b["history"]], abs=1e-6)
    assert [h["acc"] for h in a["history"]] == [h["acc"] for h in b["history"]]
    assert [e["loss"] for e in a["eval_history"]] == pytest.approx([e["loss"] for e in b["eval_history"]], abs=1e-6)


def test_resume_never_starts_over(tmp_path, data_dir, llama_target):
    settings = dict(max_steps=4, save_every=2, eval_every=2)
    first = run_training(tiny_recipe(data_dir, tmp_path / "a", **settings), target=llama_target)
    steps = []
    again = run_training(tiny_recipe(data_dir, tmp_path / "a", resume="never", **settings), target=llama_target,
                         after_step=steps.append)
    assert steps == [1, 2, 3, 4]
    assert max_weight_diff(first / "final" / "drafter", again / "final" / "drafter") == 0.0  # seeded: same run again


def test_half_written_checkpoints_are_skipped(tmp_path, data_dir, llama_target, capsys):
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=3, save_every=3)
    run_dir = run_training(recipe, target=llama_target)
    good = run_dir / "step_000003"
    # A crash mid-save leaves the temporary folder; a copy without the marker must not count either.
    (run_dir / "step_000006.tmp").mkdir()
    (run_dir / "step_000006.tmp" / "model.safetensors").write_bytes(b"partial")
    unmarked = run_dir / "step_000009"
    unmarked.mkdir()
    (unmarked / R.STATE_FILE).write_text(json.dumps({"step": 9}))
    assert R.list_checkpoints(run_dir) == [good]
    assert C.find_resume(run_dir, "auto") == good
    assert set(R.incomplete_checkpoints(run_dir)) == {run_dir / "step_000006.tmp", unmarked}
    with pytest.raises(DraftheadsError, match="half-written"):
        C.find_resume(run_dir, str(unmarked))

    capsys.readouterr()
    # more steps change the LR schedule, so continuing with them is asked for explicitly
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=6, save_every=3, resume=str(good))
    run_training(recipe, target=llama_target)
    out = capsys.readouterr().out
    assert "skipping half-written checkpoint" in out and "resuming from" in out and "step_000003" in out
    state = json.loads((run_dir / "step_000006" / R.STATE_FILE).read_text())
    assert state["step"] == 6 and (run_dir / "step_000006" / R.COMPLETE).is_file()
    assert not (run_dir / "step_000006.tmp").exists()  # the save of step 6 replaced the leftover


def test_keep_last_prunes_old_checkpoints_but_never_the_best(tmp_path, data_dir, llama_target, monkeypatch):
    """Eval is rigged so step 2 is best by acceptance length although later evals have lower loss."""
    scores = iter([(5.0, 0.5), (1.0, 0.9), (0.5, 0.8), (0.1, 0.7), (0.1, 0.6), (0.1, 0.4)])  # (loss, accept_len)

    def fake_evaluate(run, depth):
        loss, accept = next(scores)
        return {"loss": loss, "acc": [accept], "depth_loss": [loss], "accept_len": accept, "positions": 1, "tokens": 1}

    monkeypatch.setattr(loop, "evaluate", fake_evaluate)
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=6, save_every=1, eval_every=1, keep_last=2)
    run_dir = run_training(recipe, target=llama_target)
    assert [p.name for p in R.list_checkpoints(run_dir)] == ["step_000002", "step_000005", "step_000006"]
    best = json.loads((run_dir / "best" / "metrics.json").read_text())
    assert best["step"] == 2 and best["accept_len"] == 0.9
    assert json.loads((run_dir / "best" / "drafter" / "config.json").read_text())["extra"]["step"] == 2
    final = json.loads((run_dir / "final" / "metrics.json").read_text())
    assert final["best_step"] == 2 and final["best_accept_len"] == 0.9


def test_prune_counts_only_complete_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        folder = R.step_dir(tmp_path, step)
        folder.mkdir()
        (folder / R.STATE_FILE).write_text("{}")
        (folder / R.COMPLETE).write_text("")
    (tmp_path / "step_000005.tmp").mkdir()
    removed = C.prune(tmp_path, keep_last=1, protect=2)
    assert sorted(p.name for p in removed) == ["step_000001", "step_000003"]
    assert [p.name for p in R.list_checkpoints(tmp_path)] == ["step_000002", "step_000004"]


def test_checkpoint_holds_a_reloadable_recipe_and_drafter(tmp_path, data_dir, llama_target):
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=3, save_every=3)
    run_dir = run_training(recipe, target=llama_target)
    folder = run_dir / "step_000003"
    again = load_recipe(str(folder / "recipe.yaml"))
    assert again.to_dict() == {k: v for k, v in recipe.to_dict().items() if k != "derived"}
    config = json.loads((folder / "drafter" / "config.json").read_text())
    assert config["head"]["type"] == "medusa" and config["target"]["hidden_size"] == llama_target.config.hidden_size
    state = json.loads((folder / R.STATE_FILE).read_text())
    assert {"step", "epoch", "batch_in_epoch", "best_metric", "history"} <= set(state)
