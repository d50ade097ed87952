"""SGLang: EAGLE-1 (`LlamaForCausalLMEagle` / `Qwen2ForCausalLMEagle`), EAGLE-3 (`LlamaForCausalLMEagle3`) and
DFlash (`DFlashDraftModel`) folders. EAGLE tensor names are the public EAGLE layout's (interop/eagle_layout.py),
DFlash's z-lab's (interop/dflash_layout.py); both modules also read SGLang's folders back.

EAGLE-3 and DFlash drafters read target layers' outputs, which SGLang asks of the target's own model class
(`set_eagle3_layers_to_capture`, `set_dflash_layers_to_capture`): only the targets listed below are served.
"""

from __future__ import annotations

import shlex

from draftheads.core.errors import DraftheadsError
from draftheads.interop.dflash_layout import ARCHITECTURE as DFLASH_ARCHITECTURE
from draftheads.interop.dflash_layout import dflash_config, dflash_tensors, dflash_to_engine
from draftheads.interop.eagle_layout import (
    eagle3_fields,
    eagle3_tensors,
    eagle3_to_engine,
    eagle_to_engine,
    engine_layer_config,
    layer_biases,
    llama_layer,
    sglang_aux_ids,
)
from draftheads.interop.layout import SGLANG, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

RELEASE = "PyPI sglang==0.5.23"   # the wheel read for the target tables below (its _version.py names no commit)
# target model_type -> the class SGLang builds for it (the EntryClass of python/sglang/srt/models/<file>), where that
# class has set_eagle3_layers_to_capture, which model_runner_components/attention_backend_setup.py
# (configure_aux_hidden_state_capture) requires of the target for EAGLE-3, else a ValueError at start-up. Without it:
# mixtral (mixtral.py), gemma (gemma.py), gemma2 (gemma2.py), olmo2 (olmo2.py), granite (granite.py), cohere2
# (commandr.py Cohere2ForCausalLM), smollm3 (no class: the TransformersForCausalLM fallback of registry.py).
EAGLE3_TARGETS = {
    "llama": "llama.py LlamaForCausalLM", "mistral": "mistral.py MistralForCausalLM (a LlamaForCausalLM)",
    "phi3": "llama.py Phi3ForCausalLM (a LlamaForCausalLM)", "qwen2": "qwen2.py Qwen2ForCausalLM",
    "qwen2_moe": "qwen2_moe.py Qwen2MoeForCausalLM", "qwen3": "qwen3.py Qwen3ForCausalLM",
    "qwen3_moe": "qwen3_moe.py Qwen3MoeForCausalLM", "qwen3_next": "qwen3_next.py Qwen3NextForCausalLM",
    "qwen3_5": "qwen3_5.py Qwen3_5ForConditionalGeneration", "qwen3_5_text": "qwen3_5_text.py Qwen3_5ForCausalLM",
    "qwen3_5_moe": "qwen3_5.py Qwen3_5MoeForConditionalGeneration",
    "qwen3_5_moe_text": "qwen3_5_text.py Qwen3_5MoeForCausalLM",
    "gemma3": "gemma3_mm.py Gemma3ForConditionalGeneration", "gemma3_text": "gemma3_causal.py Gemma3ForCausalLM",
    "gemma4": "gemma4_mm.py Gemma4ForConditionalGeneration", "gemma4_text": "gemma4_causal.py Gemma4ForCausalLM",
    "glm4_moe": "glm4_moe.py Glm4MoeForCausalLM", "deepseek_v2": "deepseek_v2.py DeepseekV2ForCausalLM",
    "deepseek_v3": "deepseek_v2.py DeepseekV3ForCausalLM", "gpt_oss": "gpt_oss.py GptOssForCausalLM",
}
# likewise for DFlash: set_dflash_layers_to_capture (the same function; its other hook serves DSpark drafters only).
# Of the EAGLE-3 targets, qwen2, qwen2_moe, gemma3, gemma3_text and glm4_moe lack it.
DFLASH_TARGETS = {t: EAGLE3_TARGETS[t] for t in (
    "llama", "mistral", "phi3", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
    "qwen3_5_moe_text", "gemma4", "gemma4_text", "deepseek_v2", "deepseek_v3", "gpt_oss")}
TARGET_FILES = (
    LoaderFile(SGLANG, "python/sglang/srt/model_executor/model_runner_components/attention_backend_setup.py", RELEASE),
    LoaderFile(SGLANG, "python/sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py", RELEASE),
    LoaderFile(SGLANG, "python/sglang/srt/models/registry.py", RELEASE),
    LoaderFile(SGLANG, "python/sglang/srt/models/*.py (EntryClass, the capture hooks)", RELEASE),
)

LAYOUTS = (
    Layout(
        format="sglang", kind="eagle", engine="SGLang (LlamaForCausalLMEagle / Qwen2ForCausalLMEagle)",
        weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle",),  # Qwen2ForCausalLMEagle for a qwen2 target
        config={"num_hidden_layers": "1", "(rest)": "the target's config with its model_type"},
        tensors=(Tensor("fc.weight", ("H", "2H")), Tensor("fc.bias", ("H",)))
                + llama_layer("layers.0.", "H", input_norm=False),
        families=("llama", "mistral", "qwen2"),
        read_from=(
            LoaderFile(SGLANG, "python/sglang/srt/models/llama_eagle.py", "3b64d5dee0756de843b5f022966f69c995cd15ea"),
            LoaderFile(SGLANG, "python/sglang/srt/models/qwen2_eagle.py", "088a7eafdf9c119c5376056db011e29e187bd498"),
        ),
        traps=(
            "fc always has a bias (nn.Linear default): a folder without fc.bias leaves it uninitialised",
            "layer 0's input_layernorm is replaced by the identity; "
            "names that match nothing are dropped without a warning",
            "embed_tokens and lm_head are replaced by the target's at start-up",
        ),
    ),
    Layout(
        format="sglang", kind="eagle3", engine="SGLang (LlamaForCausalLMEagle3)", weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle3",),
        config={
            "model_type": "llama", "num_hidden_layers": "1 (anything else raises)", "draft_vocab_size": "Vd",
            "target_hidden_size": "H", "tie_word_embeddings": "false (true makes lm_head the full-vocab embedding)",
            "eagle_config": "{'eagle_aux_hidden_state_layer_ids': [l, ...]}: target layer OUTPUTS (SGLang adds 1)",
            "eagle_aux_hidden_state_layer_ids": "the same layers as hidden_states indices (l + 1), for vLLM and "
                                                "llama.cpp's converter",
        },
        tensors=eagle3_tensors("midlayer."),
        families=("llama", "mistral"),
        targets=tuple(EAGLE3_TARGETS),
        read_from=(
            LoaderFile(SGLANG, "python/sglang/srt/models/llama_eagle3.py", "d737979cbd17c6162f39c1953cfa72d3d23cc0d0"),
            LoaderFile(SGLANG, "python/sglang/srt/models/llama.py",
                       "set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]"),
            LoaderFile(SGLANG, "python/sglang/srt/models/deepseek_v2.py", RELEASE),
        ) + TARGET_FILES,
        traps=(
            "tie_word_embeddings true with a smaller draft vocabulary: lm_head becomes the embedding",
            "explicit aux ids are layer outputs (+1 internally) but the default [2, N//2, N-3] is raw",
            "DeepSeek-V2/V3 targets add 1 only when the first id is 1; other lists are read as layer inputs "
            "(eagle_layout.sglang_aux_ids writes them so; a drafter reading layer 0 first is refused)",
            "a target class without set_eagle3_layers_to_capture: a ValueError at start-up",
            "weights whose names match nothing are skipped silently; d2t offsets become hot_token_id",
            "embed_tokens is the target's table without Gemma's sqrt(H) (get_embed_and_head shares the weight): "
            "harmless here, since the layer RMS-normalises the embedding before anything else reads it",
        ),
    ),
    Layout(
        format="sglang", kind="dflash", engine="SGLang (DFlashDraftModel, --speculative-algorithm DFLASH)",
        weights_file="model.safetensors",
        architectures=(DFLASH_ARCHITECTURE,),
        config={
            "model_type": "qwen3", "num_hidden_layers": "L (draft layers)",
            "block_size": "B (dflash_config.block_size first, then the top level; default 16)",
            "dflash_config": "{mask_token_id, target_layer_ids: target layer OUTPUTS, block_size, num_target_layers}",
            "layer_types": "['full_attention'] * L: bidirectional (encoder-only) attention within the block",
            "hidden_act": "silu (anything else raises)", "(rest)": "the target's attention/MLP/rope/norm fields",
        },
        tensors=dflash_tensors(own_lm_head=False),
        targets=tuple(DFLASH_TARGETS),
        read_from=(
            LoaderFile(SGLANG, "python/sglang/srt/models/dflash.py", "003b23d7388eabdfbfecd2610c7e228f9f6a2734"),
            LoaderFile(SGLANG, "python/sglang/srt/speculative/dflash_utils.py", "parse_dflash_draft_config"),
            LoaderFile(SGLANG, "python/sglang/srt/speculative/dflash_worker_v2.py", RELEASE),
        ) + TARGET_FILES,
        traps=(
            "block_size missing: 16, whatever the drafter was trained for",
            "mask_token_id missing: the token '<|MASK|>' is looked up in the tokenizer instead",
            "target_layer_ids missing: z-lab's spread for num_target_layers, silently",
            "no embedding or lm_head of its own: the target's, over the whole vocabulary (a drafter trained with a "
            "draft vocabulary, the target lm_head's rows for it, drafts over every token there, as EAGLE-1/2 does)",
            "weights whose names match nothing are ignored without a warning",
            "a target class without set_dflash_layers_to_capture: a ValueError at start-up",
            "the block is embedded by the target's embedding module (Gemma 4's carries its sqrt(H), as ours does)",
        ),
    ),
)


def write_eagle(s: SavedDrafter):
    """LlamaForCausalLMEagle (Qwen2ForCausalLMEagle for a qwen2 target), fc with its bias."""
    qkv, o = layer_biases(s.state)
    if o or (qkv and s.family != "qwen2"):
        raise DraftheadsError("SGLang's EAGLE layers cannot hold this layer's attention biases; export --format vllm")
    model_type, arch = ("qwen2", "Qwen2ForCausalLMEagle") if s.family == "qwen2" else ("llama", "LlamaForCausalLMEagle")
    config = engine_layer_config(s.target_config(), model_type, [arch], s.dtype)
    return eagle_to_engine(s.state, fold_fc_bias=False), config, "model.safetensors"


def write_eagle3(s: SavedDrafter):
    """LlamaForCausalLMEagle3 with midlayer.* names and SGLang's aux-layer numbering (in eagle_config)."""
    # SGLang adds 1 itself to ids given in eagle_config: they name the layers whose OUTPUT is read. The top-level key,
    # in the hidden-state numbering of vLLM and llama.cpp's converter, serves tools that read this folder with those.
    extra = eagle3_fields(s, [layer + 1 for layer in s.head.feature_layers])
    extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang_aux_ids(s.head.feature_layers, s.family)}
    config = engine_layer_config(s.layer_config(), "llama", ["LlamaForCausalLMEagle3"], s.dtype, **extra,
                                 tie_word_embeddings=False)
    return eagle3_to_engine(s.state, "midlayer."), config, "model.safetensors"


def refusal(saved: SavedDrafter) -> str | None:
    """SGLang loads its layouts for the families and targets each lists (EAGLE attention biases are refused by the
    writer), except an EAGLE-3 drafter that reads layer 0 first on a DeepSeek target."""
    if saved.kind == "eagle3" and sglang_aux_ids(saved.head.feature_layers, saved.family) is None:
        return (f"SGLang's {saved.family} target reads eagle_config's layer ids as layer inputs unless the first is 1, "
                f"so a drafter reading the output of layer 0 first cannot be named to it "
                f"(head.feature_layers {list(saved.head.feature_layers)}; train with a first layer of 1 or more)")
    return None


def write_dflash(s: SavedDrafter):
    """DFlashDraftModel: the z-lab names, no vocabulary tensors (SGLang drafts through the target's lm_head)."""
    return dflash_to_engine(s, own_lm_head=False), dflash_config(s, own_lm_head=False), "model.safetensors"


WRITERS = {"eagle": write_eagle, "eagle3": write_eagle3, "dflash": write_dflash}

ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "dflash": "DFLASH"}   # --speculative-algorithm of each kind


def serve_command(s: SavedDrafter, model: str, target: str) -> str:
    """SGLang's server for `target` drafting with the folder `model`: EAGLE drafters a chain of the export's draft
    length (n steps, top-1, n + 1 tokens verified), DFlash its block (the folder's block_size)."""
    command = (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --speculative-algorithm "
               f"{ALGORITHMS[s.kind]} --speculative-draft-model-path {shlex.quote(model)}")
    if s.kind == "dflash":
        return command
    n = s.speculative_tokens
    return f"{command} --speculative-num-steps {n} --speculative-eagle-topk 1 --speculative-num-draft-tokens {n + 1}"
