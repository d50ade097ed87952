"""Shared pieces of the training tests: a target-generated dataset from a tiny target, a recipe
pointing at it, a minimal drafter with a real loss and random input noise, and weight reading."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from draftheads.heads.parts.files import WeightsOnly
from draftheads.recipe import recipe_from_dict


@torch.no_grad()
def make_dataset(target, folder: Path, rows: int = 24, seed: int = 0, min_len: int = 12, max_len: int = 40) -> Path:
    """Rows like `draftheads data` writes: a random prompt (loss_mask 0) then tokens sampled from the target (1)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompts = torch.randint(3, 8, (rows,), generator=g).tolist()
    totals = torch.randint(min_len, max_len + 1, (rows,), generator=g).tolist()
    # All rows sampled together after 7 random tokens; row r keeps the last prompts[r] of them as its
    # prompt (close enough to target-generated for these tests, and one batched forward per token).
    ids = torch.randint(0, vocab, (rows, 7), generator=g)
    while ids.shape[1] < max_len + 7:
        logits = target(ids).logits[:, -1].float()
        ids = torch.cat([ids, torch.multinomial(torch.softmax(logits / 0.7, -1), 1, generator=g)], dim=1)
    data = {"input_ids": [], "loss_mask": [], "prompt_id": []}
    for r, (prompt, total) in enumerate(zip(prompts, totals)):
        row = ids[r, 7 - prompt: 7 - prompt + total].tolist()  # prompt tokens then sampled tokens
        data["input_ids"].append(row)
        data["loss_mask"].append([0] * prompt + [1] * (total - prompt))
        data["prompt_id"].append(r)
    Dataset.from_dict(data).save_to_disk(str(folder))
    return folder


class Crash(Exception):
    """Raised by crash_at's hook: training stops as if killed after that step (its checkpoint written)."""


def crash_at(step_to_die: int):
    def hook(step):
        if step == step_to_die:
            raise Crash(f"killed after step {step}")
    return hook


def tiny_recipe(data_dir: Path, run_dir: Path, head: dict | None = None, **train):
    """A recipe for a few fp32 CPU steps on the tiny dataset; `train` overrides train.* keys."""
    settings = dict(output_dir=str(run_dir), max_steps=6, batch_size=4, grad_accum=1, max_length=64, lr=3e-3,
                    warmup_steps=1, eval_fraction=0.2, eval_every=3, save_every=3, log_every=2, keep_last=2,
                    dtype="fp32", feature_dtype="fp32", seed=0)
    settings.update(train)
    return recipe_from_dict({
        "name": "tiny",
        "target": {"device": "cpu"},
        "head": head or {"type": "medusa", "num_heads": 2},
        "data": {"output": str(data_dir)},
        "train": settings,
        "log": {"trackers": []},
    })


def drafter_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = drafter_weights(a), drafter_weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)


@dataclass
class NoisyConfig:
    type: str = "noisy"
    noise: float = 0.5


class NoisyDrafter(torch.nn.Module):
    """Two linear heads predicting x_{t+2} and x_{t+3} from h_t plus uniform noise while training.

    The noise draws from torch's global RNG, so a resumed run matches a straight one only if the
    trainer restores RNG state exactly.
    """

    feature_layers = (-1,)
    trains_target = False

    def __init__(self, hidden: int, vocab: int, noise: float = 0.5):
        super().__init__()
        self.config = NoisyConfig(noise=noise)
        self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, vocab) for _ in range(2))
        self.files = WeightsOnly(self)

    # the rest of core/drafter.py's TrainableDrafter that training and checkpoints use
    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": list(self.parameters()), "lr": lr}]


    def training_loss(self, batch: dict):
        h = batch["features"].to(self.heads[0].weight.dtype)
        if self.training:
            h = h + (torch.rand_like(h) - 0.5) * self.config.noise
        valid = batch["attention_mask"].bool() & batch["loss_mask"].bool()
        losses, correct, total, loss_sum = [], [], [], []
        for k, head in enumerate(self.heads):
            shift = k + 2
            mask = batch["attention_mask"].bool()[:, :-shift] & valid[:, shift:]
            logits = head(h[:, :-shift][mask])
            labels = batch["input_ids"][:, shift:][mask]
            ce = F.cross_entropy(logits, labels, reduction="sum")
            losses.append(ce / max(labels.numel(), 1))
            correct.append((logits.argmax(-1) == labels).sum())
            total.append(labels.numel())
            loss_sum.append(ce.detach())
        metrics = {"correct": torch.stack(correct), "total": torch.tensor(total), "loss_sum": torch.stack(loss_sum)}
        return sum(losses), metrics


def reset_accelerate():
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
