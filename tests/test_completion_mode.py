"""data.mode: completion end to end on a base model: a target folder whose tokenizer has no chat template, loaded by
name through the calls the CLI makes. `draftheads data` writes rows whose prompt is raw text, `draftheads train`
takes two steps of the real loop on them, and `draftheads eval` of the drafter renders its prompts exactly as the
data's were, with no template asked for anywhere."""

from __future__ import annotations

import json

import pytest

from draftheads.data.datagen import run_data
from draftheads.data.datastore import load_rows
from draftheads.decoding.settings import DecodeSettings
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.measurement.conversations import Conversation, EvalSettings, first_chat
from draftheads.recipe import recipe_from_dict
from draftheads.training.loop import run_training
from tests.fixtures import make_base_tokenizer, make_target
from tests.training.train_helpers import reset_accelerate, tiny_recipe

PROMPTS = ["Write a function that adds two numbers", "def add(a, b):", "The quick brown fox", "for i in range(10):",
           "import numpy as np", "class Stack:"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """(recipe, prompt file, drafter folder): data made and a Medusa drafter trained in completion mode."""
    root = tmp_path_factory.mktemp("base")
    tok = make_base_tokenizer()
    make_target("llama", tok).save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    settings = tiny_recipe(root / "data", root / "run", max_steps=2, save_every=1, eval_every=1).to_dict()
    settings.pop("derived", None)
    settings["target"].update(name=str(root / "target"), dtype="fp32")
    settings["data"].update(mode="completion", prompts=[{"source": str(prompts)}], num_prompts=len(PROMPTS),
                            max_new_tokens=8, max_length=64, batch_size=3)
    recipe = recipe_from_dict(settings)
    run_data(recipe)
    try:
        run = run_training(recipe)
    finally:
        reset_accelerate()
    return recipe, prompts, run / "final" / "drafter"


def test_eval_renders_prompts_as_the_data_did(base_run):
    recipe, _, drafter = base_run
    model, tokenizer, info = load_eval_target(None, "fp32", [str(drafter)])
    assert info["data_mode"] == "completion"
    rows = load_rows(recipe.data_dir).with_format(None)
    written = [json.loads(line)["turns"] for line in (recipe.data_dir / "prompts.jsonl").read_text().splitlines()]
    settings = EvalSettings(DecodeSettings(max_new_tokens=8, eos_token_id=[tokenizer.eos_token_id]), max_length=64)
    for ids, mask, pid in zip(rows["input_ids"], rows["loss_mask"], rows["prompt_id"]):
        prompt = first_chat(tokenizer, Conversation(pid, written[pid], None), settings).input_ids
        assert ids[: mask.index(1)] == prompt == tokenizer(written[pid][0])["input_ids"]
        assert all(mask[len(prompt):])   # the whole continuation was trained on


def test_eval_of_the_drafter_runs_without_a_chat_template(base_run, tmp_path):
    _, prompts, drafter = base_run
    out = run_eval([str(drafter)], EvalConfig(prompts=str(prompts), limit=2, max_new_tokens=4, tree="chain:2",
                                              dtype="fp32", calibration_prompts=1),
                   out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    assert report["target"]["data_mode"] == "completion" and report["prompt_count"] == 2
    assert all(r["greedy_mismatches"] == 0 for r in report["results"] if r["rule"] == "greedy")
