"""Which targets an engine serves a hidden-state drafter on (EAGLE-3, P-EAGLE, DFlash), and SGLang's DeepSeek ids.

The engines serve such a drafter only where their model class for the target hands out chosen layers' hidden states
(vLLM: SupportsEagle3; SGLang: set_eagle3_layers_to_capture / set_dflash_layers_to_capture). The sets below were
read from vLLM 0.34.0 and SGLang 0.5.23 (see interop/vllm.py and interop/sglang.py) and are written down here
independently of those modules' tables, for the model_types of the 18 families of tests/families.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from draftheads.api import build_drafter, load_drafter
from draftheads.core.errors import DraftheadsError
from draftheads.heads.factory import head_config
from draftheads.interop import sglang, vllm
from draftheads.interop.eagle_layout import sglang_aux_ids, sglang_layers
from draftheads.interop.export import ENGINES, export_drafter, refusal
from draftheads.interop.native import SavedDrafter, save_drafter
from tests.families import FAMILY_CONFIGS, family_target

MODEL_TYPES = tuple(model_type for model_type, _ in FAMILY_CONFIGS.values())
VLLM_HIDDEN = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "gemma4_text", "phi3",
               "olmo2", "granite", "smollm3", "deepseek_v3"}   # olmo2, smollm3: the Transformers backend
SGLANG_EAGLE3 = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "gemma3_text",
                 "gemma4_text", "phi3", "glm4_moe", "deepseek_v3"}
SGLANG_DFLASH = {"llama", "mistral", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text", "gemma4_text", "phi3",
                 "deepseek_v3"}
SERVED = {
    ("vllm", "eagle3"): VLLM_HIDDEN,
    ("vllm", "peagle"): VLLM_HIDDEN,
    # vLLM's DFlash shares the bare embedding table: Gemma 4's sqrt(H) and Granite's multiplier are outside it
    ("vllm", "dflash"): VLLM_HIDDEN - {"gemma4_text", "granite"},
    ("sglang", "eagle3"): SGLANG_EAGLE3,
    ("sglang", "dflash"): SGLANG_DFLASH,
}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def saved_for(kind: str, model_type: str, feature_layers=(1, 2, 3)) -> SavedDrafter:
    """A SavedDrafter of `kind` for a target of `model_type`, with what refusal() reads and no weights."""
    fields = {"type": kind}
    if kind in ("eagle3", "peagle"):
        fields.update(draft_layer="llama", feature_layers=list(feature_layers))
    head = head_config(fields, note=lambda line: None)
    return SavedDrafter(Path("unused"), {"target": {"model_type": model_type}}, head, {}, None)


@pytest.mark.parametrize("fmt,kind", list(SERVED), ids=["-".join(k) for k in SERVED])
def test_each_family_is_served_or_refused_in_one_line_naming_engine_and_target(fmt, kind):
    for model_type in MODEL_TYPES:
        reason = refusal(saved_for(kind, model_type), fmt)
        served = model_type in SERVED[fmt, kind]
        assert (reason is None) == served, f"{fmt} {kind} {model_type}: {reason}"
        if not served:
            assert ENGINE_NAMES[fmt] in reason and model_type in reason and "\n" not in reason, reason


def test_the_target_tables_name_transformers_model_types():
    """A misspelt model_type would refuse every target of that family, silently to the table's reader."""
    tables = [vllm.AUX_TARGETS, vllm.UNSCALED_SHARED_EMBEDDING, sglang.EAGLE3_TARGETS, sglang.DFLASH_TARGETS]
    tables += [layout.targets for module in ENGINES.values() for layout in module.LAYOUTS]
    for table in tables:
        assert set(table) <= set(CONFIG_MAPPING_NAMES), set(table) - set(CONFIG_MAPPING_NAMES)


# ---- SGLang's DeepSeek targets read eagle_config's ids as layer inputs unless the first is 1 ------------------------

@pytest.mark.parametrize("model_type", ["llama", "deepseek_v3"])
def test_sglang_ids_name_the_layers_the_target_captures(model_type):
    for layers in ([1, 3, 5], [2, 3, 4], [4, 7, 9]):
        ids = sglang_aux_ids(layers, model_type)
        # what the target class then captures, as in its set_eagle3_layers_to_capture: the INPUT of layer id
        captured = [i + 1 for i in ids] if model_type == "llama" or ids[0] == 1 else ids
        assert captured == [layer + 1 for layer in layers]
        assert sglang_layers(ids, model_type) == layers
    assert sglang_aux_ids([0, 1, 2], "llama") == [0, 1, 2]
    assert sglang_aux_ids([0, 1, 2], "deepseek_v3") is None


@pytest.fixture(scope="module")
def deepseek(tokenizer, tmp_path_factory):
    target = family_target("deepseek_v3", tokenizer, num_hidden_layers=6)
    folder = tmp_path_factory.mktemp("deepseek-target")
    target.save_pretrained(folder)
    target.config._name_or_path = str(folder)
    return target


@pytest.mark.parametrize("layers,ids", [([2, 3, 4], [3, 4, 5]), ([1, 3, 4], [1, 3, 4])])
def test_sglang_export_for_a_deepseek_target_reads_back_the_same_layers(layers, ids, deepseek, tmp_path):
    drafter = build_drafter("eagle3", deepseek, draft_vocab_size=100, feature_layers=layers)
    native = save_drafter(drafter, tmp_path / "native", target=deepseek)
    out = export_drafter(native, "sglang", tmp_path / "sglang")
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert config["eagle_aux_hidden_state_layer_ids"] == [layer + 1 for layer in layers]   # vLLM's numbering
    assert load_drafter(out, deepseek).config.feature_layers == layers


def test_sglang_refuses_a_deepseek_drafter_reading_layer_0_first(deepseek, tmp_path):
    drafter = build_drafter("eagle3", deepseek, draft_vocab_size=100, feature_layers=[0, 2, 4])
    native = save_drafter(drafter, tmp_path / "native", target=deepseek)
    with pytest.raises(DraftheadsError, match="'sglang': SGLang's deepseek_v3 target .* layer 0 first") as err:
        export_drafter(native, "sglang", tmp_path / "sglang")
    assert "\n" not in str(err.value) and not (tmp_path / "sglang").exists()
    export_drafter(native, "vllm", tmp_path / "vllm")   # vLLM's ids are hidden-state indices: any layer
