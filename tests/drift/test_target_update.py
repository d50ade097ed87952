"""Updated targets: fine-tuned again on rows (LoRA merged, or every weight), reused when asked again, refused over
another folder; the folder loads as any target."""

import json

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.data.target import load_target
from draftheads.drift.target_update import MARKER, UpdateConfig, answer_batch, update_target
from tests.fixtures import make_target
from tests.margins import at_most
from tests.training.train_helpers import make_dataset


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory, llama_target):
    return make_dataset(llama_target, tmp_path_factory.mktemp("update") / "rows", rows=12)


def fresh(tokenizer):
    return make_target("llama", tokenizer), tokenizer


@pytest.mark.trains
@pytest.mark.parametrize("method", ["full", "lora"])
def test_an_update_moves_the_weights_lowers_the_loss_and_loads_as_a_target(method, rows_dir, tokenizer, tmp_path):
    base = fresh(tokenizer)[0].state_dict()
    out = update_target(rows_dir, tmp_path / method, UpdateConfig(method=method, steps=12, lr=3e-3, batch_size=4),
                        target=fresh(tokenizer), progress=lambda line: None)
    record = json.loads((out / MARKER).read_text())
    assert record["settings"]["method"] == method and len(record["losses"]) == 12
    # it learned the rows: 0.693-0.694 (lora and full alike within 0.1) under every kernel setting tried
    at_most(sum(record["losses"][-3:]) / sum(record["losses"][:3]), 1.0, "loss of the last 3 steps / first 3")
    model, loaded_tokenizer = load_target(str(out), dtype="fp32")
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    moved = [name for name, weight in model.state_dict().items() if not torch.equal(weight, base[name])]
    assert moved and not any("lora" in name for name in model.state_dict())   # LoRA merged: a plain checkpoint
    if method == "lora":   # adapters on the projections only: embeddings and norms unchanged
        assert all("proj" in name for name in moved)


def test_the_same_update_is_reused_and_another_refused(rows_dir, tokenizer, tmp_path):
    config = UpdateConfig(method="full", steps=2, lr=1e-3, batch_size=2)
    out = update_target(rows_dir, tmp_path / "u", config, target=fresh(tokenizer), progress=lambda line: None)
    stamp = (out / MARKER).stat().st_mtime_ns
    lines = []
    update_target(rows_dir, out, config, target=fresh(tokenizer), progress=lines.append)
    assert "reused" in lines[0] and (out / MARKER).stat().st_mtime_ns == stamp
    with pytest.raises(DraftheadsError, match="already exists and is not this update"):
        update_target(rows_dir, out, UpdateConfig(method="full", steps=3, lr=1e-3, batch_size=2),
                      target=fresh(tokenizer))
    (tmp_path / "mine").mkdir()
    with pytest.raises(DraftheadsError, match="already exists"):
        update_target(rows_dir, tmp_path / "mine", config, target=fresh(tokenizer))
    assert (tmp_path / "mine").is_dir()   # never removed: we did not make it


def test_labels_cover_the_answers_only(rows_dir):
    from draftheads.data.datastore import load_rows
    rows = load_rows(rows_dir)
    ids, labels, attention = answer_batch(rows, [0, 1], 512)
    for i in range(2):
        mask = torch.as_tensor(rows[i]["loss_mask"])
        n = len(mask)
        assert torch.equal(labels[i, :n] != -100, mask > 0) and bool((labels[i, n:] == -100).all())
        assert int(attention[i].sum()) == n


@pytest.mark.parametrize("bad, match", [({"method": "dora"}, "lora or full"), ({"steps": 0}, "steps"),
                                        ({"lr": -1.0}, "lr")])
def test_bad_update_settings_are_one_line_errors(bad, match):
    with pytest.raises(DraftheadsError, match=match):
        UpdateConfig(**bad)


def test_an_out_that_cannot_be_written_is_refused_before_any_work(rows_dir, tmp_path):
    """Issue 52: the update trained, then died on its mkdir. The base here does not exist: refused before it loads."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DraftheadsError, match="cannot write --out .*afile is a file, not a writable folder"):
        update_target(rows_dir, tmp_path / "afile" / "u", UpdateConfig(base=str(tmp_path / "no-target")))


def test_rows_cut_to_no_answer_are_left_out_and_none_left_is_refused_before_the_target_loads(rows_dir, tmp_path):
    """max_length cuts the answers of every row: one line, before any target loads (base names none that exists)."""
    with pytest.raises(DraftheadsError, match="the update's max_length=2 leaves no answer token in any of the"):
        update_target(rows_dir, tmp_path / "out", UpdateConfig(method="full", steps=1, max_length=2, base="nope"),
                      progress=lambda line: None)
    assert not (tmp_path / "out").exists()
