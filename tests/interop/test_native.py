"""The native drafter format: what is written, what is refused, where a run's drafter is found."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.interop.native import save_drafter
from tests.fixtures import make_target, make_tokenizer
from tests.heads.batches import make_batch, perturb


@pytest.fixture
def medusa(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2)
    perturb(drafter)
    return drafter


@pytest.mark.parametrize("lm_head", ["shared", "own"])
def test_round_trip_writes_only_the_drafters_tensors_and_restores_them(llama_target, tmp_path, lm_head):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2, lm_head=lm_head)
    perturb(drafter)
    save_drafter(drafter, tmp_path / "drafter", target=llama_target, extra={"step": 7})
    saved = load_file(str(tmp_path / "drafter" / "model.safetensors"))
    assert set(saved) == set(drafter.state_dict())
    assert any("lm_heads" in k for k in saved) == (lm_head == "own")  # the shared lm_head is never saved
    loaded = draftheads.load_drafter(tmp_path / "drafter", llama_target)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    batch = make_batch(llama_target, drafter.feature_layers)
    assert torch.equal(loaded.training_loss(batch)[0], drafter.training_loss(batch)[0])


def test_config_json_records_the_head_and_the_target(medusa, llama_target, tmp_path):
    save_drafter(medusa, tmp_path / "d", target=llama_target, extra={"step": 7})
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["format"] == "draftheads" and config["draftheads_version"] == draftheads.__version__
    assert config["head"]["type"] == "medusa" and config["head"]["num_heads"] == 2
    assert config["target"] == {
        "name": None, "revision": None, "architecture": "LlamaForCausalLM", "model_type": "llama",
        "hidden_size": 64, "vocab_size": len(make_tokenizer()), "num_layers": 4,
    }
    assert config["feature_layers"] == [-1] and config["extra"] == {"step": 7}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporary folder left behind


def test_saving_over_an_existing_drafter_replaces_it(medusa, llama_target, tmp_path):
    save_drafter(draftheads.build_drafter("medusa", llama_target, num_heads=1), tmp_path / "d", target=llama_target)
    save_drafter(medusa, tmp_path / "d", target=llama_target)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["head"]["num_heads"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize(
    "other, key",
    [
        (dict(family="llama", hidden_size=32), "hidden_size 64 but this target has hidden_size 32"),
        (dict(family="llama", tokenizer=make_tokenizer(vocab_size=420)),
         "vocab_size 384 but this target has vocab_size 420"),
        (dict(family="qwen2"), "architecture LlamaForCausalLM but this target has architecture Qwen2ForCausalLM"),
    ],
)
def test_refuses_a_different_target_in_one_line(medusa, llama_target, tmp_path, other, key):
    save_drafter(medusa, tmp_path / "d", target=llama_target)
    with pytest.raises(DraftheadsError) as e:
        draftheads.load_drafter(tmp_path / "d", make_target(**other))
    assert key in str(e.value) and "\n" not in str(e.value)


def test_finds_the_drafter_of_a_run_folder(medusa, llama_target, tmp_path):
    run = tmp_path / "runs" / "x"
    for step, complete in ((10, True), (20, True), (30, False)):
        save_drafter(medusa, run / f"step_{step:06d}" / "drafter", target=llama_target, extra={"step": step})
        if complete:
            (run / f"step_{step:06d}" / "COMPLETE").write_text("")
            (run / f"step_{step:06d}" / "trainer_state.json").write_text("{}")
    from draftheads.interop.native import resolve_drafter_folder

    assert resolve_drafter_folder(run) == run / "step_000020" / "drafter"  # newest complete checkpoint
    save_drafter(medusa, run / "final" / "drafter", target=llama_target)
    assert resolve_drafter_folder(run) == run / "final" / "drafter"
    assert draftheads.load_drafter(run, llama_target).config.num_heads == 2


def test_one_line_errors_for_folders_that_hold_no_drafter(llama_target, tmp_path):
    with pytest.raises(DraftheadsError, match="does not exist"):
        draftheads.load_drafter(tmp_path / "missing", llama_target)
    with pytest.raises(DraftheadsError, match="has no config.json"):
        draftheads.load_drafter(tmp_path, llama_target)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(DraftheadsError, match="neither a draftheads drafter nor"):
        draftheads.load_drafter(tmp_path, llama_target)


@pytest.mark.parametrize("edit, message", [("drop", "missing"), ("add", "unexpected")])
def test_weights_that_do_not_match_the_config_are_refused(medusa, llama_target, tmp_path, edit, message):
    save_drafter(medusa, tmp_path / "d", target=llama_target)
    file = tmp_path / "d" / "model.safetensors"
    state = load_file(str(file))
    if edit == "drop":
        state.pop("heads.1.0.linear.bias")
    else:
        state["heads.2.0.linear.bias"] = torch.zeros(64)
    save_file(state, str(file))
    with pytest.raises(DraftheadsError, match=message):
        draftheads.load_drafter(tmp_path / "d", llama_target)


def test_loaded_drafter_takes_the_targets_dtype(medusa, llama_target, tmp_path):
    save_drafter(medusa, tmp_path / "d", target=llama_target)
    target = make_target("llama").to(torch.bfloat16)
    loaded = draftheads.load_drafter(tmp_path / "d", target)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert torch.equal(loaded.heads[0][0].linear.weight, medusa.heads[0][0].linear.weight.to(torch.bfloat16))


def test_build_drafter_rejects_unknown_types_and_keys(llama_target):
    with pytest.raises(DraftheadsError, match="did you mean 'medusa'"):
        draftheads.build_drafter("medusae", llama_target)
    with pytest.raises(DraftheadsError, match="did you mean 'num_heads'"):
        draftheads.build_drafter("medusa", llama_target, num_head=3)


def test_a_truncated_weights_file_is_a_one_line_error(medusa, llama_target, tmp_path):
    save_drafter(medusa, tmp_path / "d", target=llama_target)
    weights = tmp_path / "d" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(DraftheadsError, match="is damaged and cannot be read") as info:
        draftheads.load_drafter(tmp_path / "d", llama_target)
    assert "\n" not in str(info.value)


def test_export_reads_the_recorded_target_at_its_revision_and_says_when_it_runs_its_code(tmp_path, capsys):
    """Issue 57: the settings a drafter's recipe loaded its target with apply to that target, never to another."""
    from draftheads.interop.native import SavedDrafter

    config = {"target": {"name": "some-org/some-model", "settings": {"revision": "v2", "trust_remote_code": True}}}
    recorded = SavedDrafter(tmp_path, config, None, {}, None)
    assert recorded.target_location() == ("some-org/some-model", {"revision": "v2", "trust_remote_code": True})
    recorded.target_location()
    assert capsys.readouterr().err.count("with trust_remote_code=true, as the drafter's recipe did") == 1
    assert SavedDrafter(tmp_path, config, None, {}, "other-org/model").target_location() == ("other-org/model", {})
