"""The shared world of the tests that run the real CLI on bad inputs (test_bad_inputs.py) and damaged state files
(test_damaged_state.py): tiny targets, a data folder with a feature cache, trained runs, a recipe. Registered once,
by tests/conftest.py, so a session running both builds it once."""

import json
import shutil

import pytest
import yaml


@pytest.fixture(scope="session")
def world(tmp_path_factory, tokenizer):
    """The shared fixtures: tiny targets, a data folder (with a feature cache), a trained run, a recipe."""
    from transformers import AutoConfig, AutoModel

    from draftheads.training.loop import run_training
    from tests.fixtures import make_target
    from tests.training.train_helpers import make_dataset, reset_accelerate, tiny_recipe

    w = tmp_path_factory.mktemp("world")
    target = make_target("llama", tokenizer)
    for name, model in (("target", target), ("other", make_target("qwen2", tokenizer))):
        model.save_pretrained(w / name)
        tokenizer.save_pretrained(w / name)
    bert = AutoModel.from_config(AutoConfig.for_model("bert", vocab_size=len(tokenizer), hidden_size=32,
                                                      num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    bert.save_pretrained(w / "bert")
    tokenizer.save_pretrained(w / "bert")
    shutil.copytree(w / "target", w / "notemplate")
    (w / "notemplate" / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((w / "notemplate" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (w / "notemplate" / "tokenizer_config.json").write_text(json.dumps(config))
    make_dataset(target, w / "data")
    (w / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(2)))
    recipe = tiny_recipe(w / "data", w / "runs" / "medusa", max_steps=2, save_every=1, eval_every=1).to_dict()
    recipe.pop("derived", None)
    recipe["target"]["name"] = str(w / "target")
    (w / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    from draftheads.recipe import load_recipe

    target.name_or_path = str(w / "target")  # what the run's drafter records, as if loaded by name
    run_training(load_recipe(str(w / "recipe.yaml")), target=target)
    reset_accelerate()
    run_training(load_recipe(str(w / "recipe.yaml"), ["train.mode=offline", "train.feature_dtype=fp32",
                                                       f"train.output_dir={w / 'runs' / 'offline'}"]), target=target)
    reset_accelerate()
    return w
