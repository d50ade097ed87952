"""Does an EAGLE-3 draft layer of the target's own class accept more than the Llama layer the engines build?

    .venv/bin/python -m benchmarks.draft_layer [--family qwen3] [--steps 400]

On the embedded target (a Llama) the two are the same layer, so this runs on a small randomly initialised target of
another family (the test fixtures' Qwen3 by default, with wider layers): the target writes its own training data
(greedy answers to prompts built from the fixtures' corpus), an EAGLE-3 drafter is trained on it twice with the same
seed and steps, once per draft layer, and both are evaluated on held-out prompts with the same chain. Prints tau per
layer and their ratio. Minutes on 2 CPU cores; run it with nothing else heavy on the machine.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from draftheads.data.datagen import run_data
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.recipe import recipe_from_dict
from draftheads.training.loop import run_training
from tests.fixtures import CORPUS, make_target, make_tokenizer

WORDS = sorted({w for line in CORPUS for w in line.split()})


def prompts(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))} for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen3")
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    tokenizer = make_tokenizer()
    target = make_target(args.family, tokenizer, hidden_size=128, intermediate_size=256, num_attention_heads=8,
                         num_key_value_heads=4, head_dim=16)
    work = Path(tempfile.mkdtemp(prefix="draft-layer-"))
    (work / "train.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts(600, 0)))
    (work / "eval.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts(40, 1)))
    data = {"prompts": [{"source": str(work / "train.jsonl")}], "num_prompts": 600, "max_new_tokens": 48,
            "max_length": 96, "batch_size": 32, "output": str(work / "data")}
    run_data(recipe_from_dict({"name": "layer", "head": {"type": "medusa"}, "data": data}), target=(target, tokenizer))
    runs = {}
    for layer in ("llama", "target"):
        recipe = recipe_from_dict({
            "name": f"layer-{layer}", "target": {"device": "cpu"}, "data": data,
            "head": {"type": "eagle3", "draft_layer": layer, "draft_vocab_size": 256, "ttt_steps": 3},
            "train": {"output_dir": str(work / layer), "max_steps": args.steps, "batch_size": 16, "max_length": 96,
                      "lr": 3e-3, "warmup_steps": 20, "eval_every": args.steps, "save_every": args.steps,
                      "dtype": "fp32", "seed": 0},
            "log": {"trackers": []},
        })
        runs[layer] = str(run_training(recipe, target=target))
    config = EvalConfig(prompts=str(work / "eval.jsonl"), limit=40, tree="chain:4", max_new_tokens=48)
    report = run_eval(list(runs.values()), config, out=str(work / "eval"), target_model=(target, tokenizer),
                      progress=False)
    rows = {r["drafter"]: r for r in json.loads((report / "report.json").read_text())["results"]}
    taus = {layer: rows[layer]["tau"] for layer in runs}   # each run is named by its folder: work/llama, work/target
    print(f"{args.family} target, {args.steps} steps, chain:4, 40 held-out prompts, greedy:")
    for layer, tau in taus.items():
        print(f"  draft layer {layer:6s}  tau {tau:.3f}")
    print(f"  target-class / llama: {taus['target'] / taus['llama']:.3f}")


if __name__ == "__main__":
    main()
