"""speculators' own EAGLE-3 trainer (speculators 0.9.0: speculators.train.cli.main) on CPU for a wall-clock budget.
Runs inside .venv-speculators (it imports nothing of draftheads); benchmarks/peers.py launches it.

    .venv-speculators/bin/python benchmarks/peer_runners/speculators_train.py --minutes 10 --metrics m.json -- \
        --verifier-name-or-path TARGET --data-path DATA --save-path OUT/checkpoints ...   (speculators train flags)

Their trainer has no time budget: after --minutes of training (counted from its first step, so building the model
and the data loaders is left out, as our budget leaves out loading and the feature cache) the next step boundary
raises their own TrainingInterruptedError, which their graceful-shutdown wrapper answers by saving the model to
<save-path>/interrupted/ (config.json + model.safetensors, their save_pretrained). --metrics gets: steps, training
tokens/s (their own per-step profile: packed non-padding tokens over fetch-to-optimizer-step time), the minutes
trained and the folder of the last checkpoint.

The CPU patches below are all this needs; each says why.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from speculators.train import cli as train_cli
from speculators.train import trainer as trainer_module
from speculators.train.config import TrainConfig
from speculators.train.graceful_shutdown import TrainingInterruptedError
from speculators.train.trainer import Trainer


class StepProfiles(logging.Handler):
    """Their per-step profile, as their trainer logs it to the 'speculators.metrics' logger (log_freq 1: each step)."""

    def __init__(self):
        super().__init__()
        self.tokens, self.seconds, self.steps = 0, 0.0, 0

    def emit(self, record):
        message = record.msg
        profile = message.get("profile") if isinstance(message, dict) else None
        if profile:
            self.steps += 1
            self.tokens += profile["tokens_per_s"] * profile["step_ms"] / 1000  # their num_tokens, back out
            self.seconds += profile["step_ms"] / 1000


def patch_for_cpu() -> None:
    # 1. Trainer moves the model and each batch with .to(get_local_rank()): 0 without torchrun, which torch reads as
    #    cuda:0 (absent on a CPU-only torch).
    trainer_module.get_local_rank = lambda: "cpu"

    # 2. Trainer.__init__ sets device_type = "cuda" when torch.accelerator has no device; torch.autocast("cuda") then
    #    turns itself off on a CPU-only torch, and the bf16 hidden states meet fp32 weights (a dtype error). Their
    #    autocast is meant to run: on CPU that is torch.autocast("cpu", bf16).
    original_init = Trainer.__init__

    def init_on_cpu(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    Trainer.__init__ = init_on_cpu

    # 3. Their step timer calls torch.accelerator.synchronize(), which raises when there is no accelerator. CPU ops
    #    have finished when they return: there is nothing to wait for.
    if torch.accelerator.current_accelerator() is None:
        torch.accelerator.synchronize = lambda *args, **kwargs: None


def stop_after(minutes: float, started: list[float]) -> None:
    """Their train_epoch, with a step callback that interrupts training once `minutes` have passed since its
    first call (the start time goes to started[0])."""
    original = Trainer.train_epoch

    def check():
        if time.perf_counter() - started[0] > minutes * 60:
            raise TrainingInterruptedError("time budget")  # caught by their with_graceful_shutdown: saves, returns

    def train_epoch(self, epoch, *, step_callback=None):
        if not started:
            started.append(time.perf_counter())
        return original(self, epoch, step_callback=check)

    Trainer.train_epoch = train_epoch


def collect_profiles(handler: StepProfiles) -> None:
    """Their setup_metric_logger replaces the metric logger's handlers (dictConfig): add ours after it."""
    original = train_cli.setup_metric_logger

    def setup(*args, **kwargs):
        original(*args, **kwargs)
        logging.getLogger("speculators.metrics").addHandler(handler)

    train_cli.setup_metric_logger = setup


def last_checkpoint(save_path: Path) -> Path | None:
    """interrupted/ when the budget stopped training, else the highest epoch folder."""
    if (save_path / "interrupted" / "model.safetensors").is_file():
        return save_path / "interrupted"
    epochs = sorted((int(p.name), p) for p in save_path.iterdir() if p.is_dir() and p.name.isdigit())
    return epochs[-1][1] if epochs else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    parser.add_argument("--metrics", required=True, help="JSON file for steps, tokens/s, minutes, checkpoint")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then speculators train flags")
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    patch_for_cpu()
    started: list[float] = []
    stop_after(args.minutes, started)
    profiles = StepProfiles()
    collect_profiles(profiles)
    config = TrainConfig.resolve(train_args)
    train_cli.main(config)
    minutes = (time.perf_counter() - started[0]) / 60 if started else 0.0
    checkpoint = last_checkpoint(Path(config.trainer.save_path))
    metrics = {"trainer": "speculators", "steps": profiles.steps, "minutes": minutes,
               "train_tokens_per_s": profiles.tokens / max(profiles.seconds, 1e-9),
               "stopped_by": "time_budget" if checkpoint and checkpoint.name == "interrupted" else "epochs",
               "checkpoint": str(checkpoint) if checkpoint else None}
    Path(args.metrics).write_text(json.dumps(metrics, indent=2))
    print(json.dumps(metrics))


if __name__ == "__main__":
    main()
