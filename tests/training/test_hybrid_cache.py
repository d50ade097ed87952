"""train.mode: hybrid: the first epoch computes and caches each row's features, later epochs and resumed runs read
them; the result equals offline training on the same cached values; the disk cap stops writing, never training."""

import json

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.training.loop import run_training
from tests.training.train_helpers import Crash, crash_at, max_weight_diff, tiny_recipe

HEAD = {"type": "eagle3", "ttt_steps": 2, "input_noise": 0.0}


def recipe(data_dir, folder, **train):
    return tiny_recipe(data_dir, folder, HEAD, **{"max_steps": 12, "batch_size": 4, "save_every": 4, **train})


def cached_rows(data_dir):
    return sorted(p.name for p in (data_dir / "features").glob("hybrid-*/row_*.npy"))


def test_hybrid_caches_rows_as_it_trains_and_then_equals_offline(tmp_path, data_dir, llama_target, capsys):
    """fp32 features, so a cached row holds exactly what the online forward gave and training matches offline."""
    for old in (data_dir / "features").glob("hybrid-*"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    with pytest.raises(Crash):  # killed in the first epoch: the rows trained on so far are cached, whole
        run_training(recipe(data_dir, tmp_path / "hybrid", mode="hybrid"), target=llama_target,
                     after_step=crash_at(2))
    assert 0 < len(cached_rows(data_dir)) < 24 and "hybrid feature cache in" in capsys.readouterr().err
    hybrid = run_training(recipe(data_dir, tmp_path / "hybrid", mode="hybrid"), target=llama_target)
    # 16 of the 19 training rows in each epoch (no partial batch), other ones each epoch; the 5 held out, evaluated
    assert len(cached_rows(data_dir)) >= 21
    offline = run_training(recipe(data_dir, tmp_path / "offline", mode="offline"), target=llama_target)
    assert max_weight_diff(hybrid / "final" / "drafter", offline / "final" / "drafter") < 1e-5
    a, b = (json.loads((run / "final" / "metrics.json").read_text()) for run in (hybrid, offline))
    assert [h["loss"] for h in a["history"]] == pytest.approx([h["loss"] for h in b["history"]], abs=1e-5)


def test_the_disk_cap_stops_caching_not_training(tmp_path, data_dir, llama_target, capsys):
    run = run_training(recipe(data_dir, tmp_path / "capped", mode="hybrid", pack=True, feature_cache_max_gb=0.0,
                              feature_cache=str(tmp_path / "cache")), target=llama_target)
    assert (run / "final" / "drafter").is_dir() and not list((tmp_path / "cache").glob("row_*"))
    assert "capped at 0 GiB: 0% of the rows" in capsys.readouterr().err


def test_hybrid_with_a_sharded_target_is_refused_in_one_line(tmp_path, data_dir, llama_target):
    with pytest.raises(DraftheadsError, match="use train.mode=offline with train.shard_target"):
        run_training(recipe(data_dir, tmp_path / "x", mode="hybrid", shard_target=True), target=llama_target)
