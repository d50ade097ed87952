"""Drift: the target shift measured on rows, the drop predicted from it by hand, `run_drift` end to end on tiny
targets, and a damaged old report refused in one line."""

import json

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.drift.drift import check_same_settings, predicted_tau, run_drift
from draftheads.drift.target_shift import target_shift
from draftheads.evaluation.eval_config import EvalConfig
from tests.fixtures import make_target, make_tokenizer
from tests.margins import at_least, at_most
from tests.training.train_helpers import make_dataset


@pytest.fixture(scope="module")
def pair():
    tokenizer = make_tokenizer("chatml")
    return make_target("llama", tokenizer, seed=0), make_target("llama", tokenizer, seed=1), tokenizer


@pytest.fixture(scope="module")
def rows(pair, tmp_path_factory):
    from draftheads.data.datastore import load_rows
    return load_rows(make_dataset(pair[0], tmp_path_factory.mktemp("drift") / "rows", rows=6))


@pytest.mark.trains
def test_a_target_agrees_with_itself_and_not_with_another(pair, rows):
    old, other, _ = pair
    same = target_shift(old, old, rows)
    assert same.agreement == 1.0 and abs(same.kl) < 1e-5 and same.positions > 50 and same.rows == 6
    moved = target_shift(old, other, rows)
    # two random targets: agreement 0.0 and KL 1.65 under every kernel setting tried
    at_most(moved.agreement, 0.5, "argmax agreement with another target")
    at_least(moved.kl, 0.01, "KL to another target")
    assert moved.positions == same.positions


def test_shift_counts_equal_a_hand_count(pair, rows):
    old, other, _ = pair
    shift = target_shift(old, other, rows, limit=2)
    same = positions = 0
    for i in range(2):
        ids = torch.as_tensor(rows[i]["input_ids"])[None]
        mask = torch.as_tensor(rows[i]["loss_mask"])
        where = torch.nonzero(mask[1:] > 0).flatten()
        a, b = old(ids).logits[0, where].argmax(-1), other(ids).logits[0, where].argmax(-1)
        same, positions = same + int((a == b).sum()), positions + len(where)
    assert shift.positions == positions and shift.agreement == pytest.approx(same / positions)


def test_predicted_tau_by_hand():
    # 10 steps: 4 accepted nothing, 3 accepted 1, 3 accepted 2; tau 1.9 measured
    hist = [4, 3, 3]
    # P(>=1) = 0.6, P(>=2) = 0.3; before 1.9; after with g = 0.5: 1 + 0.3 + 0.075
    assert predicted_tau(1.9, hist, 0.5) == pytest.approx(1.9 * 1.375 / 1.9)
    assert predicted_tau(1.9, hist, 1.0) == pytest.approx(1.9)
    assert predicted_tau(1.9, hist, 0.0) == pytest.approx(1.0)
    assert predicted_tau(1.0, [], 0.3) == 1.0


def test_run_drift_measures_both_targets_and_predicts(pair, tmp_path):
    from draftheads.api import build_drafter
    from draftheads.interop.native import save_drafter

    old, new, tokenizer = pair
    data = make_dataset(old, tmp_path / "rows", rows=4)
    folder = tmp_path / "run"
    torch.manual_seed(0)
    save_drafter(build_drafter("eagle", old), folder / "final" / "drafter", old)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Write a function that adds two numbers."}) + "\n")
    config = EvalConfig(prompts=str(prompts), tree="chain:2", max_new_tokens=6)
    out = run_drift(str(folder), "new-target", config, old_target="old-target", data=str(data), rows=4,
                    out=str(tmp_path / "drift"), targets=((old, tokenizer), (new, tokenizer)))
    report = json.loads((out / "report.json").read_text())
    assert report["old_target"] == "old-target" and report["new_target"] == "new-target"
    assert 0 <= report["shift"]["agreement"] < 1 and report["shift"]["rows"] == 4
    lookup, row = report["rows"]
    assert lookup["drafter"] == "prompt-lookup" and lookup["tau_predicted"] is None   # copies text: no prediction
    old_row = json.loads((out / "old" / "report.json").read_text())["results"][1]
    new_row = json.loads((out / "new" / "report.json").read_text())["results"][1]
    assert old_row["drafter"] == row["drafter"] == "run"
    assert row["tau_old"] == old_row["tau"] and row["tau_new"] == new_row["tau"]
    assert row["tau_predicted"] == pytest.approx(predicted_tau(old_row["tau"], old_row["accepted_hist"],
                                                               report["shift"]["agreement"]))
    assert "| tau old | tau new | predicted |" in (out / "report.md").read_text()
    assert (out / "acceptance_by_depth.png").stat().st_size > 1000


def test_drift_without_data_names_the_fix(pair, tmp_path):
    from draftheads.api import build_drafter
    from draftheads.interop.native import save_drafter

    old, new, tokenizer = pair
    save_drafter(build_drafter("eagle", old), tmp_path / "run" / "final" / "drafter", old)
    with pytest.raises(DraftheadsError, match="give --data FOLDER"):
        run_drift(str(tmp_path / "run"), "x", EvalConfig(), targets=((old, tokenizer), (new, tokenizer)))


@pytest.mark.parametrize("text", ['{"settings": {"prompts": "hum', '{"settings": [], "results": []}',
                                  '{"results": []}'])
def test_a_damaged_old_report_is_one_line(tmp_path, text):
    (tmp_path / "report.json").write_text(text)
    with pytest.raises(DraftheadsError, match=f"eval report {tmp_path / 'report.json'} is damaged .*--old-report"):
        check_same_settings(tmp_path, EvalConfig())
