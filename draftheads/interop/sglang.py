"""SGLang: EAGLE-1 (`LlamaForCausalLMEagle` / `Qwen2ForCausalLMEagle`), EAGLE-3 (`LlamaForCausalLMEagle3`) and
DFlash (`DFlashDraftModel`) folders. EAGLE tensor names are the public EAGLE layout's (interop/eagle_layout.py),
DFlash's z-lab's (interop/dflash_layout.py); both modules also read SGLang's folders back.
"""

from __future__ import annotations

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
)
from draftheads.interop.layout import SGLANG, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

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
        read_from=(
            LoaderFile(SGLANG, "python/sglang/srt/models/llama_eagle3.py", "d737979cbd17c6162f39c1953cfa72d3d23cc0d0"),
            LoaderFile(SGLANG, "python/sglang/srt/models/llama.py",
                       "set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]"),
        ),
        traps=(
            "tie_word_embeddings true with a smaller draft vocabulary: lm_head becomes the embedding",
            "explicit aux ids are layer outputs (+1 internally) but the default [2, N//2, N-3] is raw",
            "weights whose names match nothing are skipped silently; d2t offsets become hot_token_id",
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
        read_from=(
            LoaderFile(SGLANG, "python/sglang/srt/models/dflash.py", "003b23d7388eabdfbfecd2610c7e228f9f6a2734"),
            LoaderFile(SGLANG, "python/sglang/srt/speculative/dflash_utils.py", "parse_dflash_draft_config"),
        ),
        traps=(
            "block_size missing: 16, whatever the drafter was trained for",
            "mask_token_id missing: the token '<|MASK|>' is looked up in the tokenizer instead",
            "target_layer_ids missing: z-lab's spread for num_target_layers, silently",
            "no embedding or lm_head of its own: the target's, over the whole vocabulary (a drafter trained with a "
            "draft vocabulary, the target lm_head's rows for it, drafts over every token there, as EAGLE-1/2 does)",
            "weights whose names match nothing are ignored without a warning",
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
    extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(s.head.feature_layers)}
    config = engine_layer_config(s.layer_config(), "llama", ["LlamaForCausalLMEagle3"], s.dtype, **extra,
                                 tie_word_embeddings=False)
    return eagle3_to_engine(s.state, "midlayer."), config, "model.safetensors"


def refusal(saved: SavedDrafter) -> str | None:
    """SGLang loads its layouts for the families each lists (EAGLE attention biases are refused by the writer)."""
    return None


def write_dflash(s: SavedDrafter):
    """DFlashDraftModel: the z-lab names, no vocabulary tensors (SGLang drafts through the target's lm_head)."""
    return dflash_to_engine(s, own_lm_head=False), dflash_config(s, own_lm_head=False), "model.safetensors"


WRITERS = {"eagle": write_eagle, "eagle3": write_eagle3, "dflash": write_dflash}
