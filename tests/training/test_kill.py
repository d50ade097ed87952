"""Training killed for real (SIGKILL, no cleanup) mid-step and mid-checkpoint, then resumed: the drafter equals
an uninterrupted run's bit for bit, in one process and in 2-process DDP, FSDP2 and DeepSpeed ZeRO-2 runs (gloo on
CPU)."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import yaml

from tests.training.train_helpers import drafter_weights, tiny_recipe

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="pip install 'draftheads[deepspeed]'")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = dict(max_steps=6, save_every=2, eval_every=3, log_every=2, keep_last=3)
# Runs the CLI after arranging for this process to SIGKILL itself at one point: "step N" during the
# optimizer update of step N (after its backward), "save N" while checkpoint N is being written.
DRIVER = """
import os, signal, sys
import torch
from draftheads.training import checkpoint
kind, n = sys.argv[1], int(sys.argv[2])
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if kind == "step":
    real, calls = torch.optim.AdamW.step, []
    def step(self, *a, **k):
        calls.append(1)
        if len(calls) == n and int(os.environ.get("RANK", "0")) == 0:
            die()
        return real(self, *a, **k)
    torch.optim.AdamW.step = step
else:
    real = checkpoint.write_recipe
    def write_recipe(path, data):
        if f"step_{n:06d}" in str(path):
            die()
        real(path, data)
    checkpoint.write_recipe = write_recipe
from draftheads.cli import main
sys.exit(main(["train", *sys.argv[3:]]))
"""


@pytest.fixture
def recipe_file(tmp_path, tiny_target_dir, data_dir):
    def write(run_dir):
        recipe = tiny_recipe(data_dir, run_dir, **SETTINGS).to_dict()
        recipe.pop("derived", None)
        recipe["target"]["name"] = str(tiny_target_dir)
        path = tmp_path / f"{run_dir.name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return path
    return write


def launch(recipe, processes=1, kill=None):
    """Train `recipe` in subprocesses (torchrun for several), optionally killed at `kill` = (kind, n)."""
    if kill:
        driver = recipe.with_name("kill_driver.py")
        driver.write_text(DRIVER)
        script = [str(driver), kill[0], str(kill[1])]
    else:
        script = ["-m", "draftheads.train"]
    port = str(29500 + os.getpid() % 1000)
    if processes in ("fsdp", "deepspeed"):  # two processes through Accelerate's FSDP2 / DeepSpeed ZeRO-2 paths
        name = {"fsdp": "fsdp_cpu.yaml", "deepspeed": "deepspeed_zero2.yaml"}[processes]
        config = os.path.join(ROOT, "draftheads", "recipes", "accelerate", name)
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
                    "--num_processes", "2", "--main_process_port", port]
    elif processes > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                    "--master_port", port]
    else:
        launcher = [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    return subprocess.run([*launcher, *script, str(recipe)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


def same_bits(a, b) -> bool:
    wa, wb = drafter_weights(a), drafter_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# FSDP's and ZeRO-2's resume (~30 s each: two launches of two processes, killed twice) run with the slow tests;
# the fast part keeps one process and DDP, which share the checkpoint and resume code with them
@pytest.mark.parametrize("processes", [1, 2, pytest.param("fsdp", marks=pytest.mark.slow),
                                       pytest.param("deepspeed", marks=[needs_deepspeed, pytest.mark.slow])],
                         ids=["one-process", "ddp-2", "fsdp-2", "zero2-2"])
def test_killed_twice_then_resumed_equals_an_uninterrupted_run(tmp_path, recipe_file, processes):
    straight = launch(recipe_file(tmp_path / "straight"), processes)
    assert straight.returncode == 0, straight.stderr[-2000:]
    run = tmp_path / "killed"
    recipe = recipe_file(run)
    first = launch(recipe, processes, kill=("step", 3))  # mid-step 3: step 2's checkpoint is the newest
    assert first.returncode != 0 and (run / "step_000002" / "COMPLETE").is_file() and not (run / "step_000004").exists()
    assert (run / "step_000002" / "pytorch_model_fsdp.bin").is_file() == (processes == "fsdp")  # FSDP's own saving
    states = run / "step_000002" / "pytorch_model" / "mp_rank_00_model_states.pt"
    assert states.is_file() == (processes == "deepspeed")
    second = launch(recipe, processes, kill=("save", 4))  # resumed from 2, killed while writing checkpoint 4
    assert second.returncode != 0 and "resuming from" in second.stdout and not (run / "step_000004").exists()
    assert (run / "step_000004.tmp").is_dir()  # the half-written checkpoint, skipped and replaced by the next save
    final = launch(recipe, processes)
    assert final.returncode == 0, final.stderr[-2000:]
    assert "step_000002" in final.stdout and "skipping half-written checkpoint" in final.stdout
    assert same_bits(tmp_path / "straight" / "final" / "drafter", run / "final" / "drafter")
