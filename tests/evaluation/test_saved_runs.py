"""A drafter remembers its target's settings (issue 57): trained with target.chat_template on a tokenizer that has
none, its run evaluates with no flags; a flag overrides a recorded setting; a drafter folder copied away from its run
(the .jinja file gone) still evaluates; folders saved before config.json recorded settings read their run's recipe;
revision and trust_remote_code only ever apply to the recorded target, with a note."""

import json
import shutil

import pytest
import torch
import yaml

from draftheads.cli import main
from draftheads.evaluation.saved_runs import load_eval_target, load_options
from tests.fixtures import make_target

TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
OTHER = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    """A 2-step Medusa run on a target folder whose tokenizer has no chat template, given as a .jinja file."""
    from draftheads.recipe import recipe_from_dict
    from draftheads.training.loop import run_training
    from tests.training.train_helpers import make_dataset, reset_accelerate, tiny_recipe

    w = tmp_path_factory.mktemp("templated")
    target = make_target("llama", tokenizer)
    target.save_pretrained(w / "notemplate")
    tokenizer.save_pretrained(w / "notemplate")
    (w / "notemplate" / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((w / "notemplate" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (w / "notemplate" / "tokenizer_config.json").write_text(json.dumps(config))
    (w / "chat.jinja").write_text(TEMPLATE)
    recipe = tiny_recipe(make_dataset(target, w / "data"), w / "runs" / "medusa", max_steps=2, save_every=1,
                         eval_every=1).to_dict()
    recipe.pop("derived", None)
    recipe["target"].update(name=str(w / "notemplate"), chat_template=str(w / "chat.jinja"), dtype="fp32")
    recipe["data"]["chat_template_kwargs"] = {"thinking": False}
    target.name_or_path = str(w / "notemplate")   # what the drafter records, as if loaded by name
    run_training(recipe_from_dict(recipe), target=target)
    reset_accelerate()
    (w / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}."}) + "\n" for i in range(3)))
    return w


def drafter_config(folder):
    return json.loads((folder / "config.json").read_text())


def test_the_drafter_records_how_its_target_was_loaded(run):
    settings = drafter_config(run / "runs" / "medusa" / "final" / "drafter")["target"]["settings"]
    assert settings == {"dtype": "fp32", "device": "cpu", "attn_implementation": "sdpa", "chat_template": TEMPLATE,
                        "chat_template_kwargs": {"thinking": False}}   # the text, not the path; no remote code


def test_eval_of_the_run_needs_no_target_flags(run, tmp_path, capsys):
    """The held-out report: `draftheads eval RUN` failed with 'no chat template' and no flag could pass one."""
    out = tmp_path / "eval"
    assert main(["eval", str(run / "runs" / "medusa"), "--prompts", str(run / "prompts.jsonl"), "--limit", "1",
                 "--calibration-prompts", "1", "--max-new-tokens", "4", "--out", str(out)]) == 0
    assert "note: loading the target as the drafter's recipe did: dtype=fp32, device=cpu, chat_template" in (
        capsys.readouterr().err)
    target = json.loads((out / "report.json").read_text())["target"]
    assert target["dtype"] == "fp32" and target["chat_template_kwargs"] == {"thinking": False}
    assert target["recorded_settings_used"] == ["dtype", "device", "chat_template", "attn_implementation"]


def test_flags_override_the_recorded_settings(run, monkeypatch):
    model, tokenizer, info = load_eval_target(None, "bf16", [str(run / "runs" / "medusa")], chat_template=OTHER)
    assert model.dtype == torch.bfloat16 and tokenizer.chat_template.endswith(OTHER)
    assert tokenizer.chat_template.startswith("{%- set thinking = false -%}")   # the recorded variables stay
    assert info["recorded_settings_used"] == ["device", "attn_implementation"]

    import draftheads.evaluation.evaluate as evaluate   # the flags reach EvalConfig, and EngineEvalConfig's alike
    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda drafters, config, **kw: seen.append(config))
    assert main(["eval", str(run / "runs" / "medusa"), "--chat-template", OTHER, "--device", "cpu"]) == 0
    assert (seen[0].chat_template, seen[0].device, seen[0].dtype) == (OTHER, "cpu", None)
    assert main(["eval", str(run / "runs" / "medusa"), "--device", "tpu"]) == 2


def test_a_drafter_folder_copied_without_its_run_keeps_its_settings(run, tmp_path):
    copy = shutil.copytree(run / "runs" / "medusa" / "final" / "drafter", tmp_path / "elsewhere" / "drafter")
    (run / "chat.jinja").rename(tmp_path / "moved.jinja")   # the path the recipe gave leads nowhere now
    try:
        model, tokenizer, _ = load_eval_target(None, None, [str(copy)])
    finally:
        (tmp_path / "moved.jinja").rename(run / "chat.jinja")
    assert model.dtype == torch.float32 and tokenizer.chat_template.endswith(TEMPLATE)


def test_a_folder_saved_before_settings_were_recorded_reads_its_runs_recipe(run, tmp_path):
    old = shutil.copytree(run / "runs" / "medusa", tmp_path / "old")
    for drafter in old.glob("**/drafter"):
        config = drafter_config(drafter)
        del config["target"]["settings"]
        (drafter / "config.json").write_text(json.dumps(config))
    recipe = yaml.safe_load(next(old.glob("step_*/recipe.yaml")).read_text())
    assert recipe["target"]["chat_template"] == str(run / "chat.jinja")   # a path, read where the eval runs
    _, tokenizer, info = load_eval_target(None, None, [str(old)])
    assert tokenizer.chat_template.endswith(TEMPLATE) and info["chat_template_kwargs"] == {"thinking": False}


def test_remote_code_and_revision_follow_only_the_recorded_target_and_are_said(capsys):
    recorded = {"trust_remote_code": True, "revision": "v2", "dtype": "bf16"}
    options, used = load_options(recorded, {"dtype": "fp32", "device": None, "chat_template": None}, same_target=False)
    assert options == {"dtype": "fp32"} and used == []   # another --target: neither its code nor its revision
    assert capsys.readouterr().err == ""
    options, used = load_options(recorded, {"dtype": None, "device": None, "chat_template": None}, same_target=True)
    assert options == {"dtype": "bf16", "revision": "v2", "trust_remote_code": True}
    assert "dtype=bf16, revision=v2, trust_remote_code=True" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_recorded_device_this_machine_lacks_falls_back_to_auto(capsys):
    options, used = load_options({"device": "cuda:1"}, {"dtype": None, "device": None, "chat_template": None}, True)
    assert options == {"device": "auto"} and used == []
    assert "ran on cuda:1, which this machine lacks" in capsys.readouterr().err
