"""Rows cut to train.max_length: a row left without an answer token is left out with a note, and a cut that leaves
no row one is refused in one line (issue 52: backward failed with "element 0 of tensors does not require grad")."""

from types import SimpleNamespace

import datasets
import numpy as np
import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.data.datastore import load_rows
from draftheads.training import batches as B
from draftheads.training.loop import run_training
from draftheads.training.setup import split_answered
from tests.training.train_helpers import tiny_recipe


def test_first_answers_by_hand():
    rows = datasets.Dataset.from_dict({
        "input_ids": [[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7], [5, 6]],
        "loss_mask": [[0, 0, 1, 1], [1, 0, 0, 1], [0, 0, 0], [1, 0]],  # position 0 has nothing to predict it from
    }).with_format("numpy")
    assert B.first_answers(rows).tolist() == [2, 3, B.NO_ANSWER, B.NO_ANSWER]


CUTS = [(False, "online"), (True, "online"), (False, "offline"), (True, "offline")]


@pytest.mark.parametrize("pack,mode", CUTS, ids=[f"{m}-{'packed' if p else 'rows'}" for p, m in CUTS])
def test_rows_cut_to_no_answer_are_left_out_and_a_cut_of_every_answer_is_refused(pack, mode, data_dir, llama_target,
                                                                                 tmp_path, capsys):
    first = B.first_answers(load_rows(data_dir))
    cut = 6  # the fixture's prompts are 3-7 tokens: some rows keep an answer, most do not
    left_out = int((first >= cut).sum())
    assert 0 < left_out < len(first) - 4
    settings = dict(max_steps=2, batch_size=2, pack=pack, mode=mode, feature_cache=str(tmp_path / "cache"))
    run = run_training(tiny_recipe(data_dir, tmp_path / "run", max_length=cut, **settings), target=llama_target)
    assert (run / "final" / "drafter" / "model.safetensors").is_file()
    note = f"{left_out} of {len(first)} rows keep no answer token within train.max_length={cut} and are left out"
    assert note in capsys.readouterr().out
    shortest = int(first.min())
    with pytest.raises(DraftheadsError, match=f"train.max_length={shortest} leaves no answer token in any of the "
                                              f"{len(first)} training rows .*raise train.max_length above {shortest}"):
        run_training(tiny_recipe(data_dir, tmp_path / "none", max_length=shortest, **settings), target=llama_target)
    assert not (tmp_path / "none").exists()


def test_with_every_row_answered_the_split_is_that_of_all_rows(data_dir, tmp_path, capsys):
    """Nothing cut away: the same hold-out as before the check existed, so runs resumed across it agree."""
    rows = load_rows(data_dir)
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_length=64)
    assert (B.first_answers(rows) < 64).all()
    train, held = split_answered(recipe, rows, SimpleNamespace(print=print))
    expected = B.split_rows(len(rows), recipe.train.eval_fraction, recipe.train.seed)
    assert np.array_equal(train, expected[0]) and np.array_equal(held, expected[1])
    assert capsys.readouterr().out == ""  # no note


def test_rows_of_one_prompt_are_held_out_together(tmp_path):
    """split_answered reads each row's prompt_id: a prompt answered twice is trained on or held out, never both."""
    rows = datasets.Dataset.from_dict({
        "input_ids": [[5, 6, 7, 8]] * 40, "loss_mask": [[0, 1, 1, 1]] * 40, "prompt_id": [i // 2 for i in range(40)],
    }).with_format("numpy", columns=["input_ids", "loss_mask"])
    recipe = SimpleNamespace(train=SimpleNamespace(max_length=8, eval_fraction=0.1, seed=0))
    train, held = split_answered(recipe, rows, SimpleNamespace(print=print))
    prompts = np.array(rows.with_format(None)["prompt_id"])
    assert len(held) == 4 and not set(prompts[train]) & set(prompts[held]) and len(train) + len(held) == 40
