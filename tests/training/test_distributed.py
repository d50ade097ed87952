"""Training past one process, executed on CPU (gloo, loopback) as the stand-in for a cluster:
FSDP2 (the drafter sharded, and the frozen target's layers with train.shard_target) and a two-machine
launch give the drafter one process gives with the same global batch; bad FSDP settings are refused."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftheads.interop.load import load_drafter
from draftheads.recipe import load_recipe
from draftheads.training.loop import run_training
from tests.training.train_helpers import max_weight_diff, tiny_recipe

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "draftheads" / "recipes" / "accelerate"
HEADS = {"eagle3": {"type": "eagle3", "ttt_steps": 2, "input_noise": 0.0}, "mtp": {"type": "mtp", "depth": 2}}
# FSDP reduce-scatters the two processes' gradients where one process adds its two micro-batches' gradients:
# the same fp32 numbers summed in another order, so the weights may differ in the last bits (1.2e-7 seen)
FP32_ORDER = 1e-5


def write_recipe(tmp_path, data_dir, target_dir, head: str, mode: str) -> Path:
    """A recipe of 4 steps of 3 rows per process; 19 training rows make 6 batches, 3 per process."""
    recipe = tiny_recipe(data_dir, tmp_path / "run", HEADS[head], mode=mode, max_steps=4, batch_size=3, save_every=2,
                         eval_every=2).to_dict()
    recipe.pop("derived", None)
    recipe["target"]["name"] = str(target_dir)
    path = tmp_path / f"{head}-{mode}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def accelerate_launch(args: list[str], recipe: Path, *overrides: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "accelerate.commands.launch", *args, "--main_process_port", str(port),
               "-m", "draftheads.train", str(recipe), *overrides]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out


def one_process(path: Path, folder: Path) -> Path:
    """The same rows in one process: two micro-batches per step, as the two processes take one each."""
    return run_training(load_recipe(str(path), ["train.grad_accum=2", f"train.output_dir={folder}"]))


def same_training(a: Path, b: Path, tolerance: float) -> None:
    assert max_weight_diff(a / "final" / "drafter", b / "final" / "drafter") <= tolerance
    ma, mb = (json.loads((run / "final" / "metrics.json").read_text()) for run in (a, b))
    assert [h["loss"] for h in ma["history"]] == pytest.approx([h["loss"] for h in mb["history"]], abs=1e-5)
    assert ma["final_eval"]["positions"] == mb["final_eval"]["positions"]


@pytest.mark.parametrize("head,mode,shard", [("eagle3", "online", False), ("eagle3", "offline", True),
                                             ("mtp", "online", True), ("mtp", "offline", False)])
def test_fsdp_two_processes_train_the_drafter_of_one(tmp_path, data_dir, tiny_target_dir, llama_target, head, mode,
                                                     shard):
    path = write_recipe(tmp_path, data_dir, tiny_target_dir, head, mode)
    out = finished(accelerate_launch(["--config_file", str(CONFIGS / "fsdp_cpu.yaml")], path,
                                     f"train.output_dir={tmp_path / 'fsdp'}", f"train.shard_target={shard}",
                                     port=29561))
    memory = next(line for line in out.splitlines() if "target weights per process" in line)
    mine, whole = (float(x) for x in re.search(r"([\d.]+) MiB of ([\d.]+) MiB", memory).groups())
    assert (mine < 0.8 * whole) if shard else (mine == whole)  # the tiny target's embeddings are a third of it
    assert "sharded over 2 processes" in memory if shard else "whole on every process" in memory
    checkpoint = tmp_path / "fsdp" / "step_000002"
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file() and not list(checkpoint.rglob("*.distcp"))
    same_training(tmp_path / "fsdp", one_process(path, tmp_path / "one"), FP32_ORDER)
    drafter = load_drafter(tmp_path / "fsdp" / "final" / "drafter", llama_target)  # a normal, whole drafter folder
    assert drafter.config.type == head


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="pip install 'draftheads[deepspeed]'")
@pytest.mark.parametrize("stage,head,mode", [(2, "eagle3", "online"), (3, "mtp", "offline")])
def test_deepspeed_two_processes_train_the_drafter_of_one(tmp_path, data_dir, tiny_target_dir, stage, head, mode):
    """DeepSpeed's own engine on CPU processes (gloo); ZeRO-3 partitions the drafter and gathers it to save."""
    path = write_recipe(tmp_path, data_dir, tiny_target_dir, head, mode)
    config = yaml.safe_load((CONFIGS / f"deepspeed_zero{stage}.yaml").read_text())
    # DeepSpeed's own config, as a user with settings beyond Accelerate's keys gives it: ZeRO-3 then partitions even
    # the tiny drafter's tensors (by default those under 100k values stay whole on every process)
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0, "stage3_gather_16bit_weights_on_model_save": True}
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                                                  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}))
    config["deepspeed_config"] = {"deepspeed_config_file": str(tmp_path / "ds.json"), "zero3_init_flag": False}
    config.pop("mixed_precision")  # Accelerate refuses settings its file would override; the recipe sets precision
    (tmp_path / "zero.yaml").write_text(yaml.safe_dump(config))
    finished(accelerate_launch(["--config_file", str(tmp_path / "zero.yaml"), "--num_processes", "2"], path,
                               f"train.output_dir={tmp_path / 'zero'}", port=29567))
    assert list((tmp_path / "zero" / "step_000002" / "pytorch_model").glob("zero_pp_rank_1_*"))  # DeepSpeed ran, x2
    # ZeRO-3 steps Adam on partitions it reduce-scattered: fp32 sums in another order, which Adam's division by
    # sqrt(v) magnifies where gradients are near zero (9.6e-6 seen)
    same_training(tmp_path / "zero", one_process(path, tmp_path / "one"), FP32_ORDER if stage == 2 else 5e-5)


def test_two_machines_on_loopback_train_the_drafter_of_one(tmp_path, data_dir, tiny_target_dir):
    """multi_node.yaml as two one-process 'machines' on 127.0.0.1 (static rendezvous): DDP across them."""
    path = write_recipe(tmp_path, data_dir, tiny_target_dir, "eagle3", "online")
    recipe = yaml.safe_load(path.read_text())
    recipe["target"]["device"] = "auto"  # = cpu here: it once started each process as a separate run of its own
    path.write_text(yaml.safe_dump(recipe))
    machines = [accelerate_launch(["--config_file", str(CONFIGS / "multi_node.yaml"), "--num_processes", "2",
                                   "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"], path,
                                  f"train.output_dir={tmp_path / 'nodes'}", port=29563) for rank in (0, 1)]
    outs = [finished(machine) for machine in machines]
    assert [out.count("held-out top-1 accuracy") for out in outs] == [1, 1]  # accelerate prints once per machine
    same_training(tmp_path / "nodes", one_process(path, tmp_path / "one"), 0.0)


def test_shard_target_outside_fsdp_is_refused_in_one_line(tmp_path, data_dir, llama_target):
    from draftheads.core.errors import DraftheadsError

    recipe = tiny_recipe(data_dir, tmp_path / "run", HEADS["eagle3"], shard_target=True)
    with pytest.raises(DraftheadsError, match="train.shard_target needs an FSDP launch"):
        run_training(recipe, target=llama_target)


def test_fsdp_sharded_checkpoints_are_refused_in_one_line(tmp_path, data_dir, tiny_target_dir):
    """SHARDED_STATE_DICT checkpoints carry pickled metadata that torch.distributed.checkpoint unpickles on resume."""
    path = write_recipe(tmp_path, data_dir, tiny_target_dir, "mtp", "online")
    config = yaml.safe_load((CONFIGS / "fsdp_cpu.yaml").read_text())
    config["fsdp_config"]["fsdp_state_dict_type"] = "SHARDED_STATE_DICT"
    (tmp_path / "sharded.yaml").write_text(yaml.safe_dump(config))
    run = accelerate_launch(["--config_file", str(tmp_path / "sharded.yaml")], path,
                            f"train.output_dir={tmp_path / 'x'}", port=29565)
    out, err = run.communicate(timeout=600)
    assert run.returncode != 0 and "set fsdp_state_dict_type: FULL_STATE_DICT" in out + err
    assert not (tmp_path / "x" / "step_000002").exists()


class Payload:
    """Not a DeepSpeed data class: unpickling it would run whatever its __reduce__ says."""

    def __reduce__(self):
        return (print, ("unpickled",))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="pip install 'draftheads[deepspeed]'")
def test_deepspeed_checkpoints_are_read_as_plain_tensors(tmp_path):
    import pickle
    import types

    import torch
    from deepspeed.runtime.fp16.loss_scaler import LossScaler

    from draftheads.training.deepspeed_support import read_checkpoints_safely

    engine = types.SimpleNamespace(checkpoint_engine=None)
    read_checkpoints_safely(engine)
    torch.save({"module": {"w": torch.ones(2)}, "loss_scaler": LossScaler(2.0)}, tmp_path / "states.pt")
    assert torch.equal(engine.checkpoint_engine.load(str(tmp_path / "states.pt"))["module"]["w"], torch.ones(2))
    torch.save({"module": Payload()}, tmp_path / "payload.pt")
    with pytest.raises(pickle.UnpicklingError):
        engine.checkpoint_engine.load(str(tmp_path / "payload.pt"))


@pytest.fixture(scope="module")
def shipped_targets(tmp_path_factory, tokenizer):
    """Target folders that ship their drafters: a GLM-4.5 checkpoint with its NextN layer, and a Gemma 4 target
    with its assistant folder beside it."""
    from tests.families import family_target
    from tests.fixtures import shipped_assistant_folder
    from tests.shipped_checkpoints import shipped_checkpoint

    root = tmp_path_factory.mktemp("shipped")
    gemma = family_target("gemma4", tokenizer)
    gemma.save_pretrained(root / "gemma4")
    tokenizer.save_pretrained(root / "gemma4")
    return {"native": (shipped_checkpoint("glm4_moe", root / "glm4_moe"), {"type": "native", "depth": 2}),
            "assistant": (root / "gemma4", {"type": "assistant", "depth": 2,
                                            "source": str(shipped_assistant_folder(gemma, root / "assistant"))})}


@pytest.mark.slow
@pytest.mark.parametrize("head,mode,shard", [("native", "online", True), ("assistant", "offline", False)])
def test_fsdp_two_processes_fine_tune_a_shipped_drafter_as_one(tmp_path, data_dir, shipped_targets, head, mode,
                                                               shard):
    """The drafters targets ship (a MoE NextN layer; Gemma 4's assistant, its keys and values cached as features)
    fine-tuned under FSDP2 as one process fine-tunes them. The rows are the tiny llama target's (the same
    tokenizer): what is checked is the distributed mechanics, not what is learned."""
    target_dir, settings = shipped_targets[head]
    recipe = tiny_recipe(data_dir, tmp_path / "run", settings, mode=mode, max_steps=4, batch_size=3, save_every=2,
                         eval_every=2).to_dict()
    recipe.pop("derived", None)
    recipe["target"]["name"] = str(target_dir)
    path = tmp_path / f"{head}-{mode}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    finished(accelerate_launch(["--config_file", str(CONFIGS / "fsdp_cpu.yaml")], path,
                               f"train.output_dir={tmp_path / 'fsdp'}", f"train.shard_target={shard}", port=29569))
    same_training(tmp_path / "fsdp", one_process(path, tmp_path / "one"), FP32_ORDER)
