"""Offline features: the cache holds exactly the target's hidden states, resumes an interrupted
build, and training on it gives the same drafter as online training."""

import json

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from draftheads.core.errors import DraftheadsError
from draftheads.data.datastore import load_rows
from draftheads.training import batches as B
from draftheads.training import features as Fe
from draftheads.training.loop import run_training
from tests.training.train_helpers import max_weight_diff, tiny_recipe


def build(target, data_dir, folder, layers, dtype="fp32", batch_size=4):
    rows = load_rows(data_dir)
    lengths = B.row_lengths(rows, 64)
    cache = Fe.build_feature_cache(Accelerator(cpu=True), target, B.RowSet(rows, 64), lengths, layers, folder, dtype,
                                   batch_size)
    return rows, lengths, cache


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cache_holds_each_rows_hidden_states(tmp_path, data_dir, llama_target, monkeypatch, dtype):
    """Rows are cached from padded batches; each must equal the row run alone (EAGLE-3-style layers)."""
    monkeypatch.setattr(Fe, "SHARD_ROWS", 5)  # several shards, the last one short
    layers = (1, 3, -1)
    rows, lengths, cache = build(llama_target, data_dir, tmp_path / "cache", layers, dtype)
    assert len(list((tmp_path / "cache").glob("shard_*.npy"))) == -(-len(rows) // 5)
    for i in range(len(rows)):
        ids = torch.as_tensor(np.asarray(rows[i]["input_ids"])[:64])[None]
        hidden = llama_target(ids, output_hidden_states=True).hidden_states
        expected = torch.cat([hidden[j] for j in layers], dim=-1)[0]
        got = cache.row(i)
        assert got.shape == (lengths[i], 3 * llama_target.config.hidden_size)
        if dtype == "fp32":
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        else:
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), expected.to(torch.bfloat16).float(), atol=0.05, rtol=0.02)
    data_bytes = sum(p.stat().st_size for p in (tmp_path / "cache").glob("shard_*.npy"))
    per_value = {"fp32": 4, "bf16": 2}[dtype]
    expected_bytes = int(lengths.sum()) * 3 * llama_target.config.hidden_size * per_value
    assert expected_bytes <= data_bytes <= expected_bytes + 256 * len(list((tmp_path / "cache").glob("shard_*.npy")))


def test_an_interrupted_build_resumes_at_the_missing_shard(tmp_path, data_dir, llama_target, monkeypatch):
    monkeypatch.setattr(Fe, "SHARD_ROWS", 5)
    folder = tmp_path / "cache"
    rows, lengths, cache = build(llama_target, data_dir, folder, (-1,))
    before = [cache.row(i).clone() for i in range(len(rows))]
    (folder / "manifest.json").unlink()  # as if killed before the end
    (folder / Fe.shard_name(2)).unlink()
    (folder / (Fe.shard_name(3) + ".tmp")).write_bytes(b"half")  # a shard being written when killed
    written = []
    real = Fe._write_shard
    monkeypatch.setattr(Fe, "_write_shard", lambda *a: (written.append(a[5]), real(*a)))
    _, _, again = build(llama_target, data_dir, folder, (-1,))
    assert written == [2]
    for i in range(len(rows)):
        assert torch.equal(again.row(i), before[i])
    written.clear()
    build(llama_target, data_dir, folder, (-1,))  # complete: nothing recomputed
    assert written == []


def test_cache_key_changes_with_what_the_values_depend_on(data_dir, llama_target, tokenizer):
    from tests.fixtures import make_target

    rows = load_rows(data_dir)
    lengths = B.row_lengths(rows, 64)
    key = Fe.cache_key(llama_target, (-1,), 64, "bf16", rows, lengths)
    assert key == Fe.cache_key(llama_target, (-1,), 64, "bf16", rows, lengths)
    assert key != Fe.cache_key(llama_target, (1, -1), 64, "bf16", rows, lengths)
    assert key != Fe.cache_key(llama_target, (-1,), 64, "fp16", rows, lengths)
    assert key != Fe.cache_key(make_target("llama", tokenizer, seed=1), (-1,), 64, "bf16", rows, lengths)
    # the same name and embeddings, one projection moved (a merged LoRA update saved over the old folder)
    updated = make_target("llama", tokenizer)
    with torch.no_grad():
        updated.model.layers[-1].mlp.down_proj.weight[0, 0] += 0.5
    updated.name_or_path = llama_target.name_or_path
    assert key != Fe.cache_key(updated, (-1,), 64, "bf16", rows, lengths)


OFFLINE_HEADS = {
    "medusa": {"type": "medusa", "num_heads": 2},
    "eagle": {"type": "eagle"},
    "eagle3": {"type": "eagle3", "ttt_steps": 2, "draft_vocab_size": 128},
    "mtp": {"type": "mtp", "depth": 2},
    "dflash": {"type": "dflash", "block_size": 4, "num_layers": 2},
    "peagle": {"type": "peagle", "depths": 3, "draft_vocab_size": 128},
    "dspark": {"type": "dspark", "block_size": 3, "markov_rank": 8},
}


@pytest.mark.parametrize("head", list(OFFLINE_HEADS))
def test_online_and_offline_training_give_the_same_drafter(tmp_path, data_dir, llama_target, head, capsys):
    settings = dict(max_steps=4, save_every=4, eval_every=4, log_every=1, feature_dtype="fp32")
    online = run_training(tiny_recipe(data_dir, tmp_path / "on", OFFLINE_HEADS[head], mode="online", **settings),
                          target=llama_target)
    offline_recipe = tiny_recipe(data_dir, tmp_path / "off", OFFLINE_HEADS[head], mode="offline",
                                 feature_cache=str(tmp_path / "cache"), **settings)
    offline = run_training(offline_recipe, target=llama_target)
    # Cached features come from a forward over other batches than the online ones, so they differ in the last fp32
    # bits, and Adam's normalised steps carry that to the weights: 1.3e-5 seen on an AMD EPYC for EAGLE-3, against
    # 4 steps of up to lr = 1e-3 each. A feature taken from the wrong position or layer moves them by 1e-3.
    assert max_weight_diff(online / "final" / "drafter", offline / "final" / "drafter") < 5e-5
    a = json.loads((online / "final" / "metrics.json").read_text())
    b = json.loads((offline / "final" / "metrics.json").read_text())
    assert [h["loss"] for h in a["history"]] == pytest.approx([h["loss"] for h in b["history"]], rel=1e-5)
    assert a["final_eval"]["acc"] == pytest.approx(b["final_eval"]["acc"], abs=1e-9)
    out = capsys.readouterr()
    assert "caching target features" in out.err and "MiB per 1k tokens" in out.err
    with capsys.disabled():
        print(f"\n[{head}] train tokens/s on the tiny fixture: online {a['train_tokens_per_s']:,.0f}, "
              f"offline {b['train_tokens_per_s']:,.0f}")


def test_offline_mode_refuses_medusa2(tmp_path, data_dir):
    recipe = tiny_recipe(data_dir, tmp_path / "run", {"type": "medusa2"}, mode="offline")
    with pytest.raises(DraftheadsError, match="train.mode=online"):
        run_training(recipe, target=object())  # refused before the target is touched


def test_a_cache_for_grown_rows_takes_the_kept_rows_shards_and_retires_the_old_cache(tmp_path, data_dir, llama_target,
                                                                                     monkeypatch):
    """As after `draftheads data` grows a folder: the old rows first, new ones after. Shards whose rows an
    earlier cache with the same settings holds are linked, not computed; other settings are left alone."""
    monkeypatch.setattr(Fe, "SHARD_ROWS", 5)
    rows = load_rows(data_dir)
    lengths = B.row_lengths(rows, 64)
    assert len(rows) >= 12
    kept = rows.select(range(12))  # shards 0 and 1 whole, shard 2 holds 2 of the grown folder's 5
    features = tmp_path / "features"

    def cache(rows, name, dtype="fp32"):
        return Fe.build_feature_cache(Accelerator(cpu=True), llama_target, B.RowSet(rows, 64), B.row_lengths(rows, 64),
                                      (-1,), features / name, dtype, 4, share_folder=True)

    cache(kept, "old")
    cache(kept, "other-dtype", "bf16")
    written = []
    real = Fe._write_shard
    monkeypatch.setattr(Fe, "_write_shard", lambda *a: (written.append(a[5]), real(*a)))
    grown = cache(rows, "new")
    shards = -(-len(rows) // 5)
    assert written == list(range(2, shards))
    assert sorted(p.name for p in features.iterdir()) == ["new", "other-dtype"]  # the old one is retired
    fresh = Fe.build_feature_cache(Accelerator(cpu=True), llama_target, B.RowSet(rows, 64), lengths, (-1,),
                                   tmp_path / "fresh", "fp32", 4)
    for i in range(len(rows)):
        torch.testing.assert_close(grown.row(i), fresh.row(i), rtol=1e-5, atol=1e-5)
    assert json.loads((features / "new" / "manifest.json").read_text())["shard_digests"] == \
        json.loads((tmp_path / "fresh" / "manifest.json").read_text())["shard_digests"]


def test_more_data_trains_on_both_folders_and_its_cache_leaves_the_first_folders_own(tmp_path, llama_target,
                                                                                     monkeypatch):
    """train.more_data: the rows of data.output, then each other folder's; the cache goes in data.output's features/,
    takes the shards of data.output's own cache, and leaves that cache for runs on data.output alone."""
    from draftheads.core.run_folder import DATA_MARKER
    from draftheads.training.setup import training_rows
    from tests.training.train_helpers import make_dataset

    monkeypatch.setattr(Fe, "SHARD_ROWS", 4)
    first, more = (make_dataset(llama_target, tmp_path / "first", rows=12, seed=1),
                   make_dataset(llama_target, tmp_path / "more", rows=6, seed=2))
    settings = dict(mode="offline", max_steps=2, save_every=2, eval_every=2)
    run_training(tiny_recipe(first, tmp_path / "alone", **settings), target=llama_target)
    written = []
    real = Fe._write_shard
    monkeypatch.setattr(Fe, "_write_shard", lambda *a: (written.append(a[5]), real(*a)))
    both = tiny_recipe(first, tmp_path / "both", more_data=[str(more)], **settings)
    rows = training_rows(both)
    assert len(rows) == 18
    assert [list(r) for r in rows[:12]["input_ids"]] == [list(r) for r in load_rows(first)["input_ids"]]
    assert [list(r) for r in rows[12:]["input_ids"]] == [list(r) for r in load_rows(more)["input_ids"]]
    run_training(both, target=llama_target)
    assert written == [3, 4]                                   # shards 0-2 hold first's 12 rows: taken over
    caches = sorted((first / "features").iterdir())
    assert len(caches) == 2 and sorted(len(json.loads((c / "manifest.json").read_text())["lengths"])
                                       for c in caches) == [12, 18]
    assert not (more / "features").exists()

    for folder, name in ((first, "smollm2-135m"), (more, "other/model")):
        (folder / DATA_MARKER).write_text(json.dumps({"complete": True, "target": {"name": name, "revision": None}}))
    with pytest.raises(DraftheadsError,
                       match=r"train.more_data: '.*more' was generated by target other/model@main.*one target"):
        training_rows(both)
