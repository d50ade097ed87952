"""What the llama.cpp tests train: a bundled SmolLM2 recipe's drafter, shrunk, for 60 steps on the embedded target's
own answers to four prompts, so that it has learned those answers and the engine's acceptance can be compared with
our loop's on the same prompts (test_llama_cpp_engine.py, test_llama_cpp_block.py)."""

from __future__ import annotations

import json
from pathlib import Path

PROMPTS = ["Write a Python function that returns the sum of a list of numbers.",
           "Write a Python function that checks whether a word is a palindrome.",
           "Explain in two sentences what a hash table is.",
           "Write a Python function that counts the vowels in a string."]


def write_prompts(where: Path) -> Path:
    """PROMPTS as a prompts file in `where`."""
    prompts = where / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return prompts


def train_small(recipe_name: str, where: Path, run: str, target, head: list[str]) -> Path:
    """<where>/<run>: `recipe_name`'s drafter with the `head` overrides, trained on <where>/data (generated from
    <where>/prompts.jsonl on first use: every drafter of one folder learns the same answers)."""
    from draftheads.data.datagen import run_data
    from draftheads.recipe import load_recipe
    from draftheads.training.loop import run_training

    prompts = where / "prompts.jsonl"
    overrides = [f"data.output={where / 'data'}", f"train.output_dir={where / run}", "data.num_prompts=4",
                 f"data.prompts=[{{source: {prompts}}}]", "data.max_new_tokens=64", "data.batch_size=4",
                 "data.shard_size=4", "train.max_steps=60", "train.batch_size=4", "train.max_length=192",
                 "train.time_budget_minutes=null", "train.eval_every=60", "train.save_every=60",
                 "train.eval_fraction=0", "train.warmup_steps=5", "train.lr=3e-3", "train.dtype=fp32",
                 "log.trackers=[]", "head.draft_vocab_size=2048", *head]
    recipe = load_recipe(recipe_name, overrides)
    if not (where / "data" / "draftheads_data.json").exists():
        run_data(recipe, target=target)
    run_training(recipe, target=target)
    return where / run
