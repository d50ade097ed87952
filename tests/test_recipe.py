"""Recipes: every bundled one validates; bad values give one-line errors."""

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.recipe import bundled_recipes, load_recipe, recipe_from_dict
from tests.fixtures import make_config


@pytest.mark.parametrize("name", bundled_recipes())
def test_every_bundled_recipe_loads_and_validates(name):
    recipe = load_recipe(name)
    assert recipe.name == name
    assert recipe.head.type in ("medusa", "medusa2", "eagle", "eagle3", "mtp", "dflash", "dspark", "peagle", "native",
                                "assistant")
    # the header comment gives the launch command
    from draftheads.recipe import read_recipe_text

    text, _ = read_recipe_text(name)
    assert text.startswith("#") and ("draftheads train" in text or "-m draftheads.train" in text)
    if "smollm2" in name:   # the embedded target answers in-process
        assert recipe.data.backend == "local"
    else:                   # full-size targets generate their data through a serving engine, started as the header says
        assert recipe.data.backend == "openai" and recipe.data.openai_url
        assert f"vllm serve {recipe.target.name}" in text and "sglang.launch_server" in text


def test_bundled_set_covers_every_head_type_for_smollm2_and_full_size():
    names = set(bundled_recipes())
    assert {"medusa-smollm2", "eagle-smollm2", "mtp-smollm2"} <= names
    full = [load_recipe(n) for n in names if "smollm2" not in n]
    assert {r.head.type for r in full} == {"medusa", "eagle", "eagle3", "mtp", "native", "assistant"}


def test_overrides_are_parsed_as_yaml_and_nested():
    recipe = load_recipe("medusa-smollm2", ["train.lr=2e-4", "head.num_heads=3", "log.trackers=[wandb]"])
    assert recipe.train.lr == pytest.approx(2e-4)
    assert recipe.head.num_heads == 3
    assert recipe.log.trackers == ["wandb"]


def test_resolve_derives_sizes_and_eagle3_layers():
    recipe = load_recipe("eagle3-llama3.1-8b", ["head.draft_vocab_size=null"])
    recipe.resolve(make_config("llama", 1000, num_hidden_layers=32))
    assert recipe.derived["hidden_size"] == 64 and recipe.derived["vocab_size"] == 1000
    assert recipe.derived["num_layers"] == 32
    assert recipe.head.feature_layers == [1, 15, 28]   # outputs: the inputs of layers 2, 16, 29, as engines count
    assert recipe.head.draft_vocab_size == 1000  # capped by the target's vocabulary


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["train.lrr=1"], "did you mean 'lr'"),
        (["trian.lr=1"], "did you mean 'train'"),
        (["train.lr=-1"], "train.lr must be positive"),
        (["head.num_heads=0"], "head.num_heads must be between 1 and"),
        (["head.type=medusaa"], "did you mean 'medusa'"),
        (["train.batch_size=abc"], "train.batch_size: expected int"),
        (["train.batch_size=true"], "train.batch_size: expected int"),
        (["train.schedule=cosin"], "did you mean 'cosine'"),
        (["log.trackers=[wandbb]"], "unknown tracker 'wandbb'"),
        (["eval.accept=[strictt]"], "unknown acceptance rule 'strictt'"),
        (["data.prompts=[]"], "data.prompts is empty"),
        (["train.lr"], "must look like section.key=value"),
        (["data.top_p=1.5"], "data.top_p must be in (0, 1]"),
        (["target.device=tpu"], "target.device 'tpu'"),
    ],
)
def test_bad_values_give_one_line_errors(overrides, expected):
    with pytest.raises(DraftheadsError) as info:
        load_recipe("medusa-smollm2", overrides)
    message = str(info.value)
    assert expected in message and "\n" not in message


def test_depth_beyond_what_the_head_supports():
    with pytest.raises(DraftheadsError, match="head.depth must be between 1 and 8"):
        load_recipe("mtp-smollm2", ["head.depth=9"])
    with pytest.raises(DraftheadsError, match="head.ttt_steps"):
        load_recipe("eagle-smollm2", ["head.ttt_steps=99"])


@pytest.mark.parametrize("layers", ["[5,2,9]", "[2,2,9]"])
def test_eagle3_layers_must_be_distinct_and_in_layer_order(layers):
    """Engines capture the layers in layer order: an unsorted list would permute fc's input columns silently."""
    with pytest.raises(DraftheadsError, match="3 different layers in increasing order"):
        load_recipe("eagle3-llama3.1-8b", [f"head.feature_layers={layers}"])


@pytest.mark.parametrize("layers, fused",
                         [(30, [1, 14, 26]), (32, [1, 15, 28]), (8, [1, 3, 4]), (6, [0, 2, 4]), (4, [0, 1, 2])])
def test_default_eagle3_layers_are_the_inputs_of_the_engines_default_layers(layers, fused):
    from draftheads.heads.eagle3 import default_feature_layers

    assert default_feature_layers(layers) == fused
    if layers >= 8:   # vLLM, SGLang, SpecForge and llama.cpp capture the inputs of layers (2, N//2, N-3)
        assert [layer + 1 for layer in fused] == [2, layers // 2, layers - 3]


def test_eagle3_layer_that_the_target_lacks():
    recipe = load_recipe("eagle3-llama3.1-8b", ["head.feature_layers=[1,2,40]"])
    with pytest.raises(DraftheadsError, match="layer 40 does not exist"):
        recipe.resolve(make_config("llama", 1000, num_hidden_layers=32))


def test_missing_head_type_and_non_mapping_sections():
    with pytest.raises(DraftheadsError, match="missing 'type'"):
        recipe_from_dict({"head": {"num_heads": 2}})
    with pytest.raises(DraftheadsError, match="train: expected a mapping"):
        recipe_from_dict({"head": {"type": "medusa"}, "train": [1, 2]})


def test_unknown_recipe_and_bad_files(tmp_path):
    with pytest.raises(DraftheadsError, match="did you mean 'eagle-smollm2'"):
        load_recipe("eagle-smolm2")
    with pytest.raises(DraftheadsError, match="not found"):
        load_recipe(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: [unclosed\n")
    with pytest.raises(DraftheadsError, match="not valid YAML at line"):
        load_recipe(str(bad))


@pytest.mark.parametrize("written, value", [("yes", True), ("On", True), ("OFF", False), ("no", False)])
def test_yaml_1_1_booleans_are_noted_with_their_key_and_kept(written, value, tmp_path, capsys):
    """PyYAML reads yes/no/on/off as booleans (YAML 1.1): the value stands, but never without a word."""
    recipe = load_recipe("medusa-smollm2", [f"target.trust_remote_code={written}"])
    assert recipe.target.trust_remote_code is value
    low = str(value).lower()
    assert (f"note: target.trust_remote_code: '{written}' read as {low} (YAML 1.1); write {low}"
            in capsys.readouterr().err)
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"name: mine\ntarget: {{trust_remote_code: {written}}}\nhead: {{type: medusa}}\n")
    assert load_recipe(str(mine)).target.trust_remote_code is value
    assert f"note: target.trust_remote_code: '{written}'" in capsys.readouterr().err


def test_true_false_and_quoted_words_need_no_note(capsys):
    recipe = load_recipe("medusa-smollm2", ["target.trust_remote_code=true", "target.trust_remote_code=False",
                                            "name='yes'"])
    assert recipe.target.trust_remote_code is False and recipe.name == "yes"
    assert "note:" not in capsys.readouterr().err


def test_a_yes_in_a_list_or_as_a_key_is_named_where_it_is():
    from draftheads.core.config import load_yaml

    said = []
    assert load_yaml("a: [1, no]\non: 2\n", note=said.append) == {"a": [1, False], True: 2}
    assert said == ["note: a[1]: 'no' read as false (YAML 1.1); write false, or \"no\" in quotes to keep the word",
                    "note: on (a key): 'on' read as true (YAML 1.1); write true, or \"on\" in quotes to keep the word"]


@pytest.mark.parametrize("family,head,refusal", [
    ("olmo2", {"type": "eagle3", "draft_layer": "target"}, "needs a pre-norm layer"),
    ("deepseek_v3", {"type": "eagle3", "draft_layer": "target"}, "has no 'q_proj'"),
])
def test_a_head_the_targets_family_cannot_carry_is_refused_when_the_recipe_is_read(family, head, refusal):
    """Built on the meta device from the target's config alone: one line before any weights load (training resolves
    the recipe against the config first)."""
    from tests.families import family_config

    recipe = load_recipe("eagle3-smollm2", [f"head={head}", "head.draft_vocab_size=100"])
    with pytest.raises(DraftheadsError, match=refusal) as refused:
        recipe.resolve(family_config(family, 384))
    assert "head.draft_layer: llama" in str(refused.value)


def test_on_a_recurrent_target_a_default_tree_with_branches_becomes_its_chain(capsys):
    from tests.families import family_config

    recipe = load_recipe("eagle3-smollm2", ["head.draft_vocab_size=100"])
    recipe.resolve(family_config("qwen3_next", 384))
    assert recipe.head.default_tree == "chain:5" and "verifies chains only" in capsys.readouterr().err
    recipe.resolve(family_config("qwen3_next", 384))   # resolved twice (config, then the loaded model): said once
    assert capsys.readouterr().err == ""
