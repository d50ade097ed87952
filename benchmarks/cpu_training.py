"""How the benchmarks train a drafter on 2 CPU cores: one offline recipe shape for a wall-clock budget, so drafters
trained by different benchmarks are trained alike (imported by the scripts beside it).

    run = train_for_minutes(EAGLE3_RUN, head, data, minutes=12, runs=Path("runs/bench"))
"""

from __future__ import annotations

from pathlib import Path

from draftheads.recipe import load_recipe, recipe_from_dict
from draftheads.training.loop import run_training

# The eagle3-smollm2 head's run folder in every benchmark: benchmarks given the same runs folder train it once
EAGLE3_RUN = "eagle3-draftheads"
MAX_STEPS = 1_000_000   # never reached: the minutes end every run
# the train settings of a recipe that choose what the drafter learns (the rest is this CPU shape)
LEARNING_CHOICES = ("loss", "depth_weights")


def recipe_drafter(recipe: str = "eagle3-smollm2") -> tuple[dict, dict]:
    """(head section, train settings) of a bundled recipe's drafter: its head, and those of its train settings that
    change what is learned (train.loss, train.depth_weights), so a benchmark trains the drafter the recipe trains."""
    sections = load_recipe(recipe).to_dict()
    train = {key: sections["train"][key] for key in LEARNING_CHOICES if sections["train"].get(key) is not None}
    return sections["head"], train


def train_for_minutes(name: str, head: dict, data: dict, minutes: float, runs: Path, *, target: str = "smollm2-135m",
                      checkpoint_every: int = 100, keep_last: int = 1, train: dict | None = None) -> Path:
    """Train `head` offline on `data` (a recipe's data section) for `minutes`, constant lr after warm-up; a rerun
    resumes the run folder runs/<name>. Evaluated and checkpointed every `checkpoint_every` steps. `train` adds or
    replaces train.* settings (a loss, depth weights, a seed)."""
    recipe = recipe_from_dict({
        "name": name, "target": {"name": target, "dtype": "auto"}, "head": head, "data": data,
        "train": {"output_dir": str(runs / name), "mode": "offline", "max_steps": MAX_STEPS,
                  "time_budget_minutes": minutes, "batch_size": 16, "max_length": 512, "lr": 1e-3,
                  "warmup_steps": 20, "schedule": "constant", "max_grad_norm": 0.5, "eval_every": checkpoint_every,
                  "save_every": checkpoint_every, "keep_last": keep_last, **(train or {})},
        "log": {"trackers": []},
    })
    return Path(run_training(recipe))
