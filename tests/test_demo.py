"""`draftheads demo` end to end on a tiny fixture target with tiny overrides: every artefact where the
docstring says, the comparison table printed, the bundled demo recipe valid."""

from __future__ import annotations

import json

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.demo import demo_recipe, run_demo
from tests.fixtures import make_target, make_tokenizer

USERS = ["Write a function that adds two numbers", "Hello! How can I help you today?", "def add(a, b):",
         "for i in range(10):", "class Stack:", "Write a function that returns the sum"]


def tiny_overrides(prompts) -> dict:
    return {
        "target.device": "cpu", "log.trackers": [],
        "data.prompts": [{"source": str(prompts)}], "data.num_prompts": 6, "data.max_new_tokens": 8,
        "data.max_length": 64, "data.batch_size": 3, "data.shard_size": 3,
        "train.max_steps": 2, "train.batch_size": 2, "train.max_length": 64, "train.warmup_steps": 1,
        "train.eval_every": 1, "train.save_every": 2, "train.eval_fraction": 0.34, "train.dtype": "fp32",
        "head.ttt_steps": 2, "head.default_tree": "chain:2",
        "head.draft_vocab_size": 128,  # the tiny target has 384 tokens
        "eval.prompts": str(prompts), "eval.limit": 2, "eval.max_new_tokens": 6,
    }


def test_demo_leaves_every_artefact_and_prints_the_table(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": u}) + "\n" for u in USERS))
    tokenizer = make_tokenizer("chatml")
    out = run_demo(str(tmp_path / "demo"), heads=("eagle", "medusa"),
                   target_model=(make_target("llama", tokenizer), tokenizer), progress=False, **tiny_overrides(prompts))
    assert out == tmp_path / "demo"
    assert (out / "data" / "prompts.jsonl").is_file() and (out / "data" / "draftheads_data.json").is_file()
    for head in ("eagle", "medusa"):
        config = json.loads((out / head / "final" / "drafter" / "config.json").read_text())
        assert config["head"]["type"] == head
    for name in ("report.json", "report.md", "acceptance_per_depth.png", "accepted_lengths.png"):
        assert (out / "eval" / name).is_file(), name
    assert not (out / "eval" / "tau_speedup_vs_temperature.png").exists()   # one temperature: nothing to plot
    summary = json.loads((out / "demo.json").read_text())
    assert set(summary["seconds"]) == {"target", "data", "train eagle", "train medusa", "eval"}
    drafters = [r["drafter"] for r in summary["results"]]
    assert drafters == ["prompt-lookup", "eagle", "eagle+lookup", "medusa", "medusa+lookup"]
    assert all(r["greedy_mismatches"] == 0 for r in summary["results"])
    printed = capsys.readouterr().out
    assert "| drafter | rule | T | tree | tau |" in printed and "| prompt-lookup | greedy |" in printed
    assert "draftheads demo [5/5]" in printed and "done in" in printed


def test_demo_recipe_is_bundled_and_overrides_apply(tmp_path):
    recipe = demo_recipe(tmp_path, {"train__max_steps": "7", "eval.limit": 3})
    assert recipe.head.type == "eagle" and recipe.data.prompts[0].source == "self"
    assert recipe.train.max_steps == 7 and recipe.eval.limit == 3          # strings parsed as YAML, like the CLI
    assert recipe.data_dir == tmp_path / "data" and recipe.run_dir == tmp_path / "eagle"
    assert recipe.eval.prompts == "humaneval" and recipe.train.time_budget_minutes <= 10


def test_demo_rejects_unknown_heads(tmp_path):
    with pytest.raises(DraftheadsError, match="choose from eagle, medusa, mtp"):
        run_demo(str(tmp_path), heads=("hydra",))


def test_a_demo_override_read_as_a_yaml_1_1_boolean_is_noted(tmp_path, capsys):
    recipe = demo_recipe(tmp_path, {"target__trust_remote_code": "off"})
    assert recipe.target.trust_remote_code is False
    assert "note: target.trust_remote_code: 'off' read as false (YAML 1.1)" in capsys.readouterr().err
