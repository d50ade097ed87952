"""The new user's run from issue 57, through the calls the CLI makes: a Gemma 3 target folder whose tokenizer has no
chat template, the user's own alpaca-format prompts, a chat template given in the recipe. `draftheads data` writes
the rows, `draftheads train` takes two steps of the real loop for each kind that crashed on the first step (EAGLE,
EAGLE-3, MTP, DFlash, P-EAGLE), and `draftheads eval` of the trained drafter, reading the template it was trained
with, decodes exactly what plain decoding does. EAGLE-3 runs in the fast part, the others are slow."""

from __future__ import annotations

import json

import pytest

from draftheads.data.datagen import run_data
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.recipe import recipe_from_dict
from draftheads.training.loop import run_training
from tests.families import family_target
from tests.fixtures import CHATML, make_base_tokenizer
from tests.training.train_helpers import reset_accelerate, tiny_recipe

ALPACA = [{"instruction": "Write a function that adds two numbers", "input": "", "output": "def add(a, b): ..."},
          {"instruction": "Explain this code", "input": "for i in range(10):\n    print(i)", "output": "It prints."},
          {"instruction": "Name a colour", "input": "", "output": "Blue."},
          {"instruction": "Sum the list", "input": "[1, 2, 3]", "output": "6"}]
HEADS = {"eagle3": {"type": "eagle3", "draft_vocab_size": 128}, "eagle": {"type": "eagle"},
         "mtp": {"type": "mtp", "depth": 2}, "dflash": {"type": "dflash", "block_size": 4},
         "peagle": {"type": "peagle", "depths": 3, "draft_vocab_size": 128}}


@pytest.fixture(scope="module")
def gemma3_data(tmp_path_factory):
    """(root, recipe settings): the target folder, the user's prompts and the data `draftheads data` wrote."""
    root = tmp_path_factory.mktemp("gemma3")
    tok = make_base_tokenizer()
    family_target("gemma3_text", tok).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    (root / "alpaca.json").write_text(json.dumps(ALPACA))
    settings = tiny_recipe(root / "data", root / "run", max_steps=2, save_every=2, eval_every=2, batch_size=2,
                          eval_fraction=0).to_dict()
    settings.pop("derived", None)
    settings["target"].update(name=str(root / "target"), dtype="fp32", chat_template=CHATML)
    settings["data"].update(prompts=[{"source": str(root / "alpaca.json"), "format": "alpaca"}],
                            num_prompts=len(ALPACA), max_new_tokens=12, max_length=96, batch_size=2)
    run_data(recipe_from_dict(settings))
    return root, settings


@pytest.mark.parametrize("kind", [pytest.param(k, marks=() if k == "eagle3" else pytest.mark.slow) for k in HEADS])
def test_each_kind_trains_on_a_gemma3_target_and_evaluates_exactly(gemma3_data, kind, tmp_path):
    root, settings = gemma3_data
    settings = {**settings, "head": HEADS[kind], "train": {**settings["train"], "output_dir": str(tmp_path / kind)}}
    try:
        run = run_training(recipe_from_dict(settings))
    finally:
        reset_accelerate()
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": row["instruction"]}) + "\n" for row in ALPACA))
    tree = "chain:2" if kind != "eagle3" else "dynamic:3,3,6"
    out = run_eval([str(run / "final" / "drafter")], EvalConfig(prompts=str(prompts), limit=2, max_new_tokens=8,
                                                                tree=tree, calibration_prompts=1),
                   out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    assert all(r["greedy_mismatches"] == 0 for r in report["results"] if r["rule"] == "greedy")
