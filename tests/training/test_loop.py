"""The training loop end to end on tiny fixtures: every head type learns and leaves the target
untouched; schedule, batching and metrics pieces; time budget; init_from; the CLI; trackers;
the bundled accelerate configs; a 2-process DDP run equals 1 process with accumulation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from draftheads.core.errors import DraftheadsError
from draftheads.data.datastore import load_rows
from draftheads.recipe import load_recipe
from draftheads.training import batches as B
from draftheads.training.loop import run_training
from draftheads.training.metrics import acceptance_length
from draftheads.training.setup import lr_factor
from tests.margins import at_most
from tests.training.train_helpers import Crash, crash_at, drafter_weights, max_weight_diff, tiny_recipe

REPO = Path(__file__).resolve().parents[2]


HEADS = {
    "medusa": {"type": "medusa", "num_heads": 2},
    "medusa-vocab": {"type": "medusa", "num_heads": 2, "draft_vocab_size": 128},
    "eagle": {"type": "eagle"},
    "eagle-vocab": {"type": "eagle", "ttt_steps": 2, "draft_vocab_size": 128},
    "eagle3": {"type": "eagle3", "ttt_steps": 2, "draft_vocab_size": 128},
    "mtp": {"type": "mtp", "depth": 2},
    "mtp-vocab": {"type": "mtp", "depth": 2, "draft_vocab_size": 128},
    "dflash": {"type": "dflash", "block_size": 4, "draft_vocab_size": 128},
    "dflash-kd": {"type": "dflash", "block_size": 3, "loss": "kd"},
    "peagle": {"type": "peagle", "depths": 3, "draft_vocab_size": 128},
    "dspark": {"type": "dspark", "block_size": 3, "draft_vocab_size": 128, "markov_rank": 8},
}


@pytest.mark.trains
@pytest.mark.parametrize("head", list(HEADS))
def test_each_head_learns_and_the_target_is_untouched(tmp_path, data_dir, llama_target, head):
    before = {k: v.clone() for k, v in llama_target.state_dict().items()}
    recipe = tiny_recipe(data_dir, tmp_path / "run", HEADS[head], max_steps=24, log_every=6, eval_every=12,
                         save_every=24, lr=3e-3, warmup_steps=2)
    run_dir = run_training(recipe, target=llama_target)
    metrics = json.loads((run_dir / "final" / "metrics.json").read_text())
    losses = [h["loss"] for h in metrics["history"]]
    assert len(losses) == 4
    # 24 steps lower the loss: the worst head (medusa-vocab) ends at 0.959 of its first logged loss under every
    # kernel setting tried (native AMX, avx2, default, one thread, oneDNN AVX2), which moved it by less than 1e-4
    at_most(losses[-1] / losses[0], 1.0, "logged loss, last / first")
    final = metrics["final_eval"]
    assert final["step"] == 24 and final["accept_len"] == pytest.approx(acceptance_length(final["acc"]))
    assert all(0 <= a <= 1 for a in final["acc"])
    # The target is frozen and shared: no weight moved, nothing became trainable, still in eval mode.
    after = llama_target.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in llama_target.parameters()) and not llama_target.training
    saved = drafter_weights(run_dir / "final" / "drafter")
    assert not any(k.startswith(("_lm_head", "_embed", "model.")) for k in saved)  # target modules are never saved


def test_lr_schedule_warms_up_then_decays():
    assert [lr_factor(s, 4, 10, "constant") for s in (0, 3, 4, 9)] == [0.25, 1.0, 1.0, 1.0]
    assert lr_factor(4, 4, 10, "cosine") == 1.0
    assert lr_factor(7, 4, 10, "cosine") == pytest.approx(0.5)  # half-way through the decay
    assert lr_factor(7, 4, 10, "linear") == pytest.approx(0.5)
    assert lr_factor(10, 4, 10, "linear") == 0.0
    assert lr_factor(0, 0, 10, "linear") == 1.0


def test_simulated_acceptance_length_is_the_sum_of_prefix_products():
    assert acceptance_length([0.5, 0.4, 0.5]) == pytest.approx(0.5 + 0.5 * 0.4 + 0.5 * 0.4 * 0.5)
    assert acceptance_length([1.0, 1.0]) == 2.0
    assert acceptance_length([0.0, 0.9]) == 0.0


def test_epoch_batches_are_seeded_complete_and_bucketed():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 500, size=1000)
    idx = np.arange(1000)
    a = B.epoch_batches(idx, lengths, 8, seed=0, epoch=0)
    assert a == B.epoch_batches(idx, lengths, 8, seed=0, epoch=0)
    assert a != B.epoch_batches(idx, lengths, 8, seed=0, epoch=1)
    flat = [i for b in a for i in b]
    assert len(flat) == len(set(flat)) == 1000 and all(len(b) == 8 for b in a)

    def padding(batches):
        return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)

    plain = B.epoch_batches(idx, lengths, 8, seed=0, epoch=0, bucket=False)
    assert padding(a) < 0.2 * padding(plain)
    shards = [B.shard(a, r, 3) for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    assert not set(map(tuple, shards[0])) & set(map(tuple, shards[1]))


def test_eval_split_is_seeded_disjoint_and_never_empty():
    train, held = B.split_rows(100, 0.05, seed=3)
    assert len(held) == 5 and not set(train) & set(held) and len(train) + len(held) == 100
    assert np.array_equal(held, B.split_rows(100, 0.05, seed=3)[1])
    assert not np.array_equal(held, B.split_rows(100, 0.05, seed=4)[1])
    assert len(B.split_rows(10, 0.01, seed=0)[1]) == 1
    assert len(B.split_rows(10, 0.0, seed=0)[1]) == 0


def test_eval_split_holds_out_whole_prompts():
    """Two answers per prompt (data.samples_per_prompt 2): a held-out row's sibling is never trained on. One row per
    prompt gives the split without groups, so runs on such data resume with the hold-out they started with."""
    prompts = np.repeat(np.arange(50), 2)
    train, held = B.split_rows(100, 0.05, seed=3, groups=prompts)
    assert not set(prompts[train]) & set(prompts[held]) and len(train) + len(held) == 100
    assert len(held) == 6 and (np.bincount(prompts[held]) % 2 == 0).all()  # 5 rows asked for: 3 whole prompts
    unique = np.arange(100)[::-1].copy()
    assert all(np.array_equal(a, b) for a, b in zip(B.split_rows(100, 0.05, 3, unique), B.split_rows(100, 0.05, 3)))
    with pytest.raises(DraftheadsError, match="2 rows from 1 prompt.*too few to hold whole prompts out"):
        B.split_rows(2, 0.5, seed=0, groups=np.zeros(2, dtype=np.int64))


def test_time_budget_stops_cleanly_and_says_so(tmp_path, data_dir, llama_target, capsys):
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=50, time_budget_minutes=1e-6)
    run_dir = run_training(recipe, target=llama_target)
    metrics = json.loads((run_dir / "final" / "metrics.json").read_text())
    assert metrics["stopped_by"] == "time_budget" and metrics["steps"] == 1
    assert (run_dir / "step_000001" / "COMPLETE").is_file() and metrics["final_eval"]["step"] == 1
    assert "time budget" in capsys.readouterr().out


def test_a_run_stopped_by_its_time_budget_is_finished_and_run_again_trains_nothing(tmp_path, data_dir, llama_target,
                                                                                    capsys):
    """Run again (a benchmark resuming its run folder, say), it keeps final/ as it was instead of training one more
    step past the budget; raising the budget continues it."""
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=50, time_budget_minutes=1e-6)
    run_dir = run_training(recipe, target=llama_target)
    before = (run_dir / "final" / "drafter" / "model.safetensors").stat().st_mtime_ns
    steps = []
    capsys.readouterr()
    run_training(tiny_recipe(data_dir, run_dir, max_steps=50, time_budget_minutes=1e-6), target=llama_target,
                 after_step=steps.append)
    assert steps == [] and "has finished (1 of 50 steps" in capsys.readouterr().out
    assert (run_dir / "final" / "drafter" / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(Crash):
        run_training(tiny_recipe(data_dir, run_dir, max_steps=50, time_budget_minutes=60), target=llama_target,
                     after_step=lambda step: steps.append(step) or crash_at(3)(step))
    assert steps == [2, 3]


@pytest.mark.parametrize("form", ["vocab_mapping.pt", "d2t.npy", "drafter"])
def test_a_draft_vocabulary_from_specforge_speculators_or_a_run_is_reused_exactly(form, tmp_path, data_dir,
                                                                                  llama_target):
    from safetensors.torch import load_file

    from draftheads.interop.vocab_mapping import write_vocab_mappings

    vocab = llama_target.config.vocab_size
    chosen = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[:32].sort().values
    d2t = chosen - torch.arange(32)
    (tmp_path / "maps").mkdir()
    write_vocab_mappings(tmp_path / "maps", d2t, vocab)
    head = {"type": "eagle3", "draft_vocab_size": 32}
    source = tmp_path / "maps" / form
    if form == "drafter":   # an earlier run of ours, whose vocabulary came from the SpecForge file
        source = run_training(tiny_recipe(data_dir, tmp_path / "first", head, max_steps=1,
                                          draft_vocab_from=str(tmp_path / "maps" / "vocab_mapping.pt")),
                              target=llama_target)
    run_dir = run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=1, draft_vocab_from=str(source)),
                           target=llama_target)
    assert torch.equal(load_file(str(run_dir / "final" / "drafter" / "model.safetensors"))["d2t"], d2t)
    with pytest.raises(DraftheadsError,
                       match="holds 32 tokens but head.draft_vocab_size is 16; set head.draft_vocab_size: 32"):
        run_training(tiny_recipe(data_dir, tmp_path / "bad", {**head, "draft_vocab_size": 16}, max_steps=1,
                                 draft_vocab_from=str(source)), target=llama_target)


def test_eagle3_draft_vocabulary_is_the_most_frequent_loss_masked_tokens(tmp_path, data_dir, llama_target):
    from safetensors.torch import load_file

    recipe = tiny_recipe(data_dir, tmp_path / "run", {"type": "eagle3", "draft_vocab_size": 32}, max_steps=1)
    run_dir = run_training(recipe, target=llama_target)
    rows = load_rows(data_dir)
    train_idx, _ = B.split_rows(len(rows), 0.2, 0)
    counts = B.loss_token_counts(rows, train_idx, 64, llama_target.config.vocab_size)
    d2t = load_file(str(run_dir / "final" / "drafter" / "model.safetensors"))["d2t"]
    chosen = (torch.arange(32) + d2t).tolist()
    assert len(set(chosen)) == 32
    assert int(counts[chosen].sum()) == sum(sorted(counts.tolist(), reverse=True)[:32])  # the 32 most frequent


def test_init_from_starts_from_a_trained_drafter(tmp_path, data_dir, llama_target):
    first = run_training(tiny_recipe(data_dir, tmp_path / "a", max_steps=6), target=llama_target)
    trained = first / "final" / "drafter"
    assert any(float(t.abs().max()) > 0 for t in drafter_weights(trained).values())  # not the zero init any more
    head = {"type": "medusa", "num_heads": 2, "init_from": str(trained)}
    second = run_training(tiny_recipe(data_dir, tmp_path / "b", head, max_steps=1, lr=1e-12, warmup_steps=0),
                          target=llama_target)
    assert max_weight_diff(trained, second / "final" / "drafter") < 1e-8
    wrong = {"type": "eagle", "init_from": str(trained)}
    with pytest.raises(DraftheadsError, match="holds a medusa drafter"):
        run_training(tiny_recipe(data_dir, tmp_path / "c", wrong, max_steps=1), target=llama_target)


def write_recipe(tmp_path, data_dir, target_dir, **train) -> Path:
    recipe = tiny_recipe(data_dir, tmp_path / "run", **train).to_dict()
    recipe["target"]["name"] = str(target_dir)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_the_module_cli_trains_a_yaml_recipe_and_reports_errors(tmp_path, data_dir, tiny_target_dir, capsys):
    from draftheads.train import main

    path = write_recipe(tmp_path, data_dir, tiny_target_dir, max_steps=2)
    assert main([str(path), "train.eval_every=1", f"train.output_dir={tmp_path / 'cli-run'}"]) == 0
    assert (tmp_path / "cli-run" / "final" / "drafter" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "cli-run" / "final" / "metrics.json").read_text())["eval_history"][0]["step"] == 1
    capsys.readouterr()
    assert main([str(path), "train.lr=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train.lr must be positive") and err.count("\n") == 1
    assert main([str(path), f"data.output={tmp_path / 'missing'}"]) == 2
    assert "run `draftheads data RECIPE` first" in capsys.readouterr().err


def test_trackers_write_locally_and_a_missing_package_is_one_line(tmp_path, data_dir, llama_target, monkeypatch):
    import importlib.util

    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=2, log_every=1)
    recipe.log.trackers = ["tensorboard"]
    run_dir = run_training(recipe, target=llama_target)
    assert list((run_dir / "logs").rglob("events.out.tfevents.*"))

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    recipe.log.trackers = ["trackio"]
    with pytest.raises(DraftheadsError, match="pip install trackio"):
        run_training(recipe, target=llama_target)


def test_wandb_runs_offline_without_an_account(tmp_path, data_dir, llama_target, monkeypatch):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_DIR", "WANDB_MODE", "WANDB_SILENT"):
        monkeypatch.delenv(name, raising=False)  # also restores whatever the run sets
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc login either
    recipe = tiny_recipe(data_dir, tmp_path / "run", max_steps=2, log_every=1)
    recipe.log.trackers = ["wandb"]
    run_dir = run_training(recipe, target=llama_target)
    assert os.environ["WANDB_MODE"] == "offline"
    assert list((run_dir / "wandb").glob("offline-run-*"))


def test_bundled_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    expected = {"single_gpu": "NO", "multi_gpu_ddp": "MULTI_GPU", "fsdp": "FSDP", "fsdp_cpu": "FSDP",
                "multi_node": "MULTI_GPU", "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED"}
    for name, kind in expected.items():
        path = REPO / "draftheads" / "recipes" / "accelerate" / f"{name}.yaml"
        assert path.read_text().startswith("#") and "accelerate launch --config_file" in path.read_text()
        config = load_config_from_file(str(path))
        assert config.distributed_type.value == kind
    assert (load_config_from_file(str(REPO / "draftheads/recipes/accelerate/deepspeed_zero2.yaml"))
            .deepspeed_config["zero_stage"] == 2)


def test_two_process_ddp_equals_one_process_with_accumulation(tmp_path, data_dir, tiny_target_dir):
    """DDP averages the two ranks' gradients; one process accumulating the same two batches does the same.
    (~16 s on 2 idle cores: two launched processes each import torch/transformers.)

    19 training rows in batches of 3 give 6 batches per epoch: rank r takes batches r, r+2, r+4, and
    the single process takes them in pairs (0,1), (2,3), (4,5), so every step sees the same rows.
    """
    path = write_recipe(tmp_path, data_dir, tiny_target_dir, max_steps=4, batch_size=3, save_every=2, eval_every=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                "29517"]
    done = subprocess.run([*launcher, "-m", "draftheads.train", str(path), f"train.output_dir={tmp_path / 'ddp'}"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("held-out top-1 accuracy") == 1  # printed by the main process only
    recipe = load_recipe(str(path), ["train.grad_accum=2", f"train.output_dir={tmp_path / 'one'}"])
    one = run_training(recipe)
    assert max_weight_diff(tmp_path / "ddp" / "final" / "drafter", one / "final" / "drafter") < 1e-6
    a = json.loads((tmp_path / "ddp" / "final" / "metrics.json").read_text())
    b = json.loads((one / "final" / "metrics.json").read_text())
    assert [h["loss"] for h in a["history"]] == pytest.approx([h["loss"] for h in b["history"]], abs=1e-6)
    assert (a["final_eval"]["acc"] == b["final_eval"]["acc"]
            and a["final_eval"]["positions"] == b["final_eval"]["positions"])


def test_medusa2_trains_its_lora_adapter_online(tmp_path, data_dir, tokenizer):
    """Medusa-2 gets batches without features and runs the (LoRA-adapted) target itself, with gradients."""
    from tests.fixtures import make_target

    target = make_target("llama", tokenizer)  # Medusa-2 adapts the target in place: not the shared fixture
    base = {k: v.clone() for k, v in target.state_dict().items()}
    head = {"type": "medusa2", "num_heads": 2, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0}
    run_dir = run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=3), target=target)
    adapter = run_dir / "final" / "drafter" / "adapter"
    assert adapter.is_dir() and any(adapter.iterdir())
    from safetensors.torch import load_file

    lora = {k: v for f in adapter.glob("*.safetensors") for k, v in load_file(str(f)).items() if "lora_B" in k}
    assert lora and any(float(v.abs().max()) > 0 for v in lora.values())  # lora_B starts at zero: it trained
    adapted = target.state_dict() if not hasattr(target, "get_base_model") else target.get_base_model().state_dict()
    for k, v in base.items():  # the base weights under the adapter stay frozen
        match = [a for a in adapted if a.replace("base_layer.", "") == k]
        assert match and torch.equal(adapted[match[0]].float(), v.float())


def test_medusa2_checkpoints_hold_the_adapter_not_the_frozen_target(tmp_path, data_dir, tokenizer):
    from safetensors.torch import load_file

    from tests.fixtures import make_target

    head = {"type": "medusa2", "num_heads": 2, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0}
    run_dir = run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=2),
                           target=make_target("llama", tokenizer))
    saved = load_file(str(run_dir / "step_000002" / "model.safetensors"))
    under_target = [k for k in saved if k.startswith("drafter.target.")]
    assert under_target and all("lora_" in k for k in under_target)
    assert any(k.startswith("drafter.medusa.heads.") for k in saved)  # Medusa-2 holds the heads as `medusa`
    # resume restores from that checkpoint into a fresh target and carries on
    resumed = run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=3,
                                       resume=str(run_dir / "step_000002")),
                           target=make_target("llama", tokenizer))  # more steps: a deliberate continuation
    assert json.loads((resumed / "final" / "metrics.json").read_text())["steps"] == 3


def test_output_locations_are_checked_before_the_target_loads_and_a_complete_cache_only_read(data_dir, tmp_path,
                                                                                            monkeypatch):
    """Issue 52: a run folder or feature cache it cannot write ended the run at its first write, in a traceback.
    Read-only folders are simulated (as root os.access says yes to all); a complete offline cache is only read."""
    from draftheads.training.setup import check_output_locations

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.fspath(path) != os.fspath(cache))
    online = tiny_recipe(data_dir, tmp_path / "run", feature_cache=str(cache))
    check_output_locations(online)  # online runs write no cache
    offline = tiny_recipe(data_dir, tmp_path / "run", mode="offline", feature_cache=str(cache))
    with pytest.raises(DraftheadsError, match="cannot write train.feature_cache .*permission denied"):
        check_output_locations(offline)
    (cache / "manifest.json").write_text("{}")
    check_output_locations(offline)
    with pytest.raises(DraftheadsError, match="cannot write train.feature_cache"):
        check_output_locations(tiny_recipe(data_dir, tmp_path / "run", mode="hybrid", feature_cache=str(cache)))
    with pytest.raises(DraftheadsError, match="cannot write train.output_dir"):
        check_output_locations(tiny_recipe(data_dir, cache / "run"))
