"""vLLM: Medusa (`MedusaModel`), EAGLE-1 (`EagleLlamaForCausalLM`), EAGLE-3 (`LlamaForCausalLMEagle3`), P-EAGLE (the
same class with parallel_drafting), DFlash (`DFlashDraftModel`, interop/dflash_layout.py) and DSpark
(`Qwen3DSparkModel`, DeepSpec's layout, interop/deepspec.py, with a draft vocabulary where it has one) folders, written
and (Medusa) read back.

Writers take a SavedDrafter (interop/native.py) and return (tensors, config.json, weights file).
EAGLE tensor names are the public EAGLE layout's (interop/eagle_layout.py); EAGLE folders of any
engine are read by interop/load.py.

EAGLE-3, P-EAGLE, DFlash and DSpark drafters read target layers' outputs, which vLLM asks of the target's own model
class (the SupportsEagle3 interface): only the targets listed below are served.
"""

from __future__ import annotations

import json
import re
import shlex

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.heads.parts import draft_vocab
from draftheads.interop.dflash_layout import ARCHITECTURE as DFLASH_ARCHITECTURE
from draftheads.interop.dflash_layout import dflash_config, dflash_tensors, dflash_to_engine
from draftheads.interop.deepspec import ARCHITECTURE as DSPARK_ARCHITECTURE
from draftheads.interop.deepspec import MARKOV_AND_CONFIDENCE, dspark_config
from draftheads.interop.eagle_layout import (
    eagle3_fields,
    eagle3_tensors,
    eagle3_to_engine,
    eagle_to_engine,
    engine_layer_config,
    layer_biases,
    llama_layer,
    peagle_tensors,
)
from draftheads.interop.layout import LABELS, VLLM, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

RELEASE = "PyPI vllm==0.34.0 (62d4bc3c7)"   # the wheel read for the target tables below
# target model_type -> the class vLLM builds for it (model_executor/models/registry.py, model_impl auto: a native
# class first, else the Transformers backend), where that class implements SupportsEagle3 (models/interfaces.py). The
# model runner requires it of the target whenever the drafter reads hidden states (v1/worker/gpu/model_runner.py ->
# spec_decode/eagle/eagle3_utils.set_eagle3_aux_hidden_state_layers: "Model does not support EAGLE3 interface" at
# start-up): EAGLE-3 and P-EAGLE (method eagle3) and DFlash (dflash/config.py: uses_aux_hidden_states). Without it:
# mixtral (mixtral.py), qwen2_moe (qwen2_moe.py), gemma2 (gemma2.py), gemma3_text (gemma3.py Gemma3ForCausalLM),
# gemma3 (gemma3_mm.py), cohere2 (commandr.py CohereForCausalLM), glm4_moe (glm4_moe.py). Those run on the
# Transformers backend too with --model-impl transformers (SupportsEagle3): not a default, and not checked here.
TRANSFORMERS_BACKEND = "transformers/ TransformersForCausalLM (no native class)"
AUX_TARGETS = {
    "llama": "llama.py LlamaForCausalLM", "mistral": "mistral.py MistralForCausalLM (a LlamaForCausalLM)",
    "phi3": "phi3.py Phi3ForCausalLM (a LlamaForCausalLM)", "qwen2": "qwen2.py Qwen2ForCausalLM",
    "qwen3": "qwen3.py Qwen3ForCausalLM", "qwen3_moe": "qwen3_moe.py Qwen3MoeForCausalLM",
    "qwen3_next": "qwen3_next.py Qwen3NextForCausalLM",
    "qwen3_5": "vllm/models/qwen3_5 Qwen3_5ForConditionalGeneration (a Qwen3VLForConditionalGeneration)",
    "qwen3_5_text": "vllm/models/qwen3_5 Qwen3_5ForCausalLM",
    "qwen3_5_moe": "vllm/models/qwen3_5 Qwen3_5MoeForConditionalGeneration",
    "qwen3_5_moe_text": "vllm/models/qwen3_5 Qwen3_5MoeForCausalLM", "gemma": TRANSFORMERS_BACKEND,
    "gemma4": "gemma4_mm.py Gemma4ForConditionalGeneration", "gemma4_text": "gemma4.py Gemma4ForCausalLM",
    "granite": "granite.py GraniteForCausalLM", "olmo2": TRANSFORMERS_BACKEND, "smollm3": TRANSFORMERS_BACKEND,
    "deepseek_v2": "deepseek_v2.py DeepseekV2ForCausalLM", "deepseek_v3": "deepseek_v2.py DeepseekV3ForCausalLM",
    "gpt_oss": "gpt_oss.py GptOssForCausalLM",
}
TARGET_FILES = (
    LoaderFile(VLLM, "vllm/model_executor/models/interfaces.py (SupportsEagle3)", RELEASE),
    LoaderFile(VLLM, "vllm/model_executor/models/registry.py", RELEASE),
    LoaderFile(VLLM, "vllm/model_executor/models/*.py, vllm/models/qwen3_5/ (the target classes' bases)", RELEASE),
    LoaderFile(VLLM, "vllm/model_executor/models/transformers/base.py (Base: SupportsEagle3)", RELEASE),
    LoaderFile(VLLM, "vllm/v1/worker/gpu/model_runner.py", RELEASE),
    LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", RELEASE),
)
# DFlash embeds its block with the target's embedding module as is (spec_decode/eagle/utils.maybe_share_target_embed);
# these targets' classes apply their embedding scale outside it (gemma4.py: embed_tokens(ids) * normalizer; granite.py:
# * embedding_multiplier in forward), so the block would enter unscaled where this drafter trained on it scaled
UNSCALED_SHARED_EMBEDDING = {"gemma4": "sqrt(hidden_size)", "gemma4_text": "sqrt(hidden_size)",
                             "granite": "embedding_multiplier"}

LAYOUTS = (
    Layout(
        format="vllm", kind="medusa", engine="vLLM (MedusaModel)", weights_file="model.safetensors",
        architectures=("MedusaModel",),
        config={
            "model_type": "medusa", "hidden_size": "H", "vocab_size": "V",
            "truncated_vocab_size": "V, or Vd < V: draft among token_map's tokens only",
            "num_heads": "K", "num_hidden_layers": "blocks per head",
            "medusa_fc_bias": "true (else the blocks are built without biases and the biases are dropped)",
            "original_lm_head": "true: one lm head shared by all heads, read from lm_heads.0.weight",
        },
        tensors=(
            Tensor("blocks.{h}.layers.{l}.weight", ("H", "H")),
            Tensor("blocks.{h}.layers.{l}.bias", ("H",)),
            Tensor("lm_heads.{h}.weight", ("V", "H")),  # shared head: only lm_heads.0.weight; Vd rows with token_map
            Tensor("token_map", ("Vd",), "int64", when="truncated_vocab_size < V"),  # target id of each lm head row
        ),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/medusa.py", "09cddad8f0324594022359cd2b07e962a14b895f"),
            LoaderFile(VLLM, "vllm/transformers_utils/configs/medusa.py", "0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f"),
            LoaderFile(VLLM, "vllm/v1/spec_decode/medusa.py", "afe4cc5a6cca6842620df36f6d02b43a224f4974"),
        ),
        traps=(
            "without medusa_fc_bias: true the residual blocks have no bias and the saved biases are skipped",
            "the config loader renames EVERY key containing 'num'+'heads' to num_heads and 'num'+'layers' to "
            "num_hidden_layers, so no other such key (num_attention_heads, num_key_value_heads) may appear",
            "the target's lm_head is not shared: the lm head weights must be in the folder",
            "weights not named blocks.* / lm_heads.* (or medusa_heads.-prefixed) are ignored",
            "token_map is read only when truncated_vocab_size < vocab_size; "
            "lm heads with more rows are cut to token_map's",
        ),
    ),
    Layout(
        format="vllm", kind="eagle", engine="vLLM (EagleLlamaForCausalLM)", weights_file="model.safetensors",
        architectures=("EagleLlamaForCausalLM",),
        config={
            "model_type": "llama", "num_hidden_layers": "1", "attention_bias": "true when biases are folded in",
            "qkv_bias": "true when q/k/v carry biases", "tie_word_embeddings": "the target's",
            "(rest)": "the target's attention/MLP/rope/norm fields",
        },
        tensors=(Tensor("fc.weight", ("H", "2H")),) + llama_layer("layers.0.", "H", input_norm=False),
        families=("llama", "mistral", "qwen2"),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/llama_eagle.py", "e1c4a55214c63e19e83f82ad6c552d82148bae0b"),
            LoaderFile(VLLM, "vllm/model_executor/models/llama_eagle.py", "00da92319af4b2ad2cde8525b7b609c779bdc52f"),
            LoaderFile(VLLM, "vllm/model_executor/models/llama.py", "e06c9ba2a6ea923a84add30f5dafaea126429b81"),
            LoaderFile(VLLM, "vllm/transformers_utils/configs/eagle.py", "23c5aa92d517802488a0c77a5f58cd0a2019c5a3"),
        ),
        traps=(
            "fc is built with bias=False: fc.bias is a KeyError in one version and silently skipped in another; "
            "export folds the fc bias into the attention biases (exact) instead",
            "the layer's attention_bias gives q/k/v AND o_proj biases; qkv_bias overrides the q/k/v part only",
            "embed_tokens and lm_head are taken from the target (pipeline parallelism off): not needed in the folder",
            "EAGLE-1 architectures registered: EagleLlamaForCausalLM (+ Llama4, MiniCPM); no Qwen2/Qwen3 EAGLE-1 class",
        ),
    ),
    Layout(
        format="vllm", kind="eagle3", engine="vLLM (Eagle3LlamaForCausalLM / LlamaForCausalLMEagle3)",
        weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle3",),
        config={
            "model_type": "llama", "num_hidden_layers": "1", "draft_vocab_size": "Vd", "target_hidden_size": "H",
            "eagle_aux_hidden_state_layer_ids": "hidden_states indices: layer l's OUTPUT is id l + 1",
            "norm_before_residual": "false (the residual is the un-normed fc output)",
            "tie_word_embeddings": "false",
        },
        tensors=eagle3_tensors("midlayer."),
        families=("llama", "mistral"),
        targets=tuple(AUX_TARGETS),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/llama_eagle3.py", "583507d13075783a12ccbd774575974d10ca4959"),
            LoaderFile(VLLM, "vllm/model_executor/models/llama.py", "e06c9ba2a6ea923a84add30f5dafaea126429b81"),
        ) + TARGET_FILES,
        traps=(
            "a target class without SupportsEagle3: a RuntimeError at start-up",
            "embed_tokens is the target's module, without Gemma 4's sqrt(H) or Granite's multiplier: harmless here, "
            "since the layer RMS-normalises the embedding before anything else reads it",
            "q/k/v are built with bias=False: a Qwen2-style layer cannot be expressed",
            "aux ids are taken BEFORE layer id runs (input of layer id = output of layer id-1); default (2, N//2, N-3)",
            "d2t holds offsets: target_id = draft_id + d2t[draft_id]; t2d is skipped",
            "midlayer.* is renamed to layers.0.*",
        ),
    ),
    Layout(
        format="vllm", kind="dflash", engine="vLLM (DFlashQwen3ForCausalLM, speculative method dflash)",
        weights_file="model.safetensors",
        architectures=(DFLASH_ARCHITECTURE,),
        config={
            "model_type": "qwen3", "num_hidden_layers": "L (draft layers)", "block_size": "B",
            "dflash_config": "{mask_token_id, target_layer_ids: target layer OUTPUTS (vLLM adds 1), block_size, "
                             "num_target_layers}",
            "layer_types": "['full_attention'] * L: bidirectional within the block",
            "draft_vocab_size": "Vd, only with a draft vocabulary", "tie_word_embeddings": "false",
            "(rest)": "the target's attention/MLP/rope/norm fields",
        },
        tensors=dflash_tensors(own_lm_head=True),
        targets=tuple(AUX_TARGETS),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/qwen3_dflash.py", "036a00d1f5d00d449d02dce9babdd15a5b4d06c9"),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                       "0cfdd2e15d6991f354c6e22fd7f7e7577afe0424"),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/dflash/config.py", RELEASE),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/dflash/utils.py", RELEASE),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/utils.py (maybe_share_target_embed)", RELEASE),
        ) + TARGET_FILES,
        traps=(
            "a target class without SupportsEagle3: a RuntimeError at start-up",
            "the block is embedded by the target's embed_tokens module: without Gemma 4's sqrt(H) or Granite's "
            "embedding_multiplier, which those classes apply outside it (such targets are refused)",
            "eagle_aux_hidden_state_layer_ids, when present, wins over dflash_config.target_layer_ids (and is in the "
            "other numbering): it is not written",
            "without target_layer_ids the aux layers fall back to a spread of vLLM's choosing, silently",
            "rope_parameters missing: rope theta defaults to 1e6",
            "a sliding_attention layer type makes that layer causal; dflash_config.causal overrides every layer",
            "draft_vocab_size < the target's: its own lm_head [Vd, H] and d2t (renamed draft_id_to_target_id) are "
            "read from the folder; t2d is skipped",
            "no embed_tokens: the target's embedding (mask slots embed mask_token_id's row)",
        ),
    ),
    Layout(
        format="vllm", kind="dspark", engine="vLLM (Qwen3DSparkForCausalLM, speculative method dspark)",
        weights_file="model.safetensors",
        architectures=(DSPARK_ARCHITECTURE,),
        config={
            "(DeepSpec's)": "model_type qwen3 with the target's sizes, num_hidden_layers, layer_types, block_size, "
                            "mask_token_id, target_layer_ids (layer OUTPUTS: vLLM adds 1), markov_rank, "
                            "enable_confidence_head, confidence_head_with_markov (interop/deepspec.py)",
            "draft_vocab_size": "Vd, only with a draft vocabulary",
        },
        tensors=dflash_tensors(own_lm_head=True) + MARKOV_AND_CONFIDENCE,
        targets=tuple(AUX_TARGETS),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/qwen3_dspark.py", "0302ff40439493d0db2e3bbfd509211703375d08"),
            LoaderFile(VLLM, "vllm/model_executor/models/qwen3_dflash.py", "036a00d1f5d00d449d02dce9babdd15a5b4d06c9"),
            LoaderFile(VLLM, "vllm/config/speculative.py", "002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443"),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                       "0cfdd2e15d6991f354c6e22fd7f7e7577afe0424"),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/dspark/utils.py",
                       "0308cbaed08d25c17d77b0657bbb3d76bb27e5b8"),
            LoaderFile(VLLM, "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py",
                       "02957b5ac0f91813c434af93d5498b55f2aeaad1"),
        ) + TARGET_FILES,
        traps=(
            "a target class without SupportsEagle3: a RuntimeError at start-up",
            "num_speculative_tokens is the number of block slots and is not checked against block_size: any other "
            "value runs a block the drafter was not trained on (the serve command gives block_size)",
            "markov_head_type is not read: every Markov head is built as the vanilla one",
            "confidence_head_with_markov defaults to false: written explicitly",
            "eagle_aux_hidden_state_layer_ids or dflash_config.target_layer_ids would win over target_layer_ids: "
            "neither is written",
            "every tensor name but lm_head and d2t gets a `model.` prefix: the folder's names have none; t2d is "
            "skipped",
            "draft_vocab_size < the target's needs lm_head [Vd, H] and d2t, else a ValueError",
            "dspark_bonus_anchor (speculators' dialect) would add a slot: not written, DeepSpec's block it is",
            "runs on vLLM's V2 GPU model runner (VLLM_USE_V2_MODEL_RUNNER=1 where that is not the default)",
        ),
    ),
    Layout(
        format="vllm", kind="peagle",
        engine="vLLM (LlamaForCausalLMEagle3, speculative config method eagle3 + parallel_drafting: true)",
        weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle3",),
        config={
            "(EAGLE-3's)": "model_type llama, num_hidden_layers 1, draft_vocab_size, target_hidden_size, "
                           "eagle_aux_hidden_state_layer_ids (layer l's OUTPUT is id l + 1), norm_before_residual",
            "pard_token": "the mask slots' token id (the proposer reads pard_token, ptd_token_id or "
                          "dflash_config.mask_token_id, else refuses)",
        },
        tensors=peagle_tensors("midlayer."),
        families=("llama", "mistral"),
        targets=tuple(AUX_TARGETS),
        read_from=(
            LoaderFile(VLLM, "vllm/model_executor/models/llama_eagle3.py", "00bd1493b3e82d6c13c68ee8a0e1c5a96707e190"),
            LoaderFile(VLLM, "the speculative proposer's parallel-drafting token lookup", "stored file id 71127482224"),
            LoaderFile(VLLM, "vllm/config/speculative.py", RELEASE),
            LoaderFile(VLLM, "vllm/model_executor/models/llama_eagle3.py", RELEASE),
        ) + TARGET_FILES,
        traps=(
            "vLLM 0.34.0 serves no P-EAGLE: parallel_drafting with method eagle3 is a ValueError, and mask_hidden is "
            "skipped with a warning (the folder drafts as plain EAGLE-3); this layout is llama_eagle3.py 00bd1493's",
            "a target class without SupportsEagle3: a RuntimeError at start-up",
            "mask_hidden is a non-persistent buffer [1, 3H] (our [1, 1, 3H] is viewed to it); missing with "
            "parallel_drafting on: a ValueError; present with it off: skipped with a warning",
            "parallel drafting is a serving switch, not a config field: the folder alone serves as plain EAGLE-3",
            "the mask hidden vector goes through fc like the fused features (3H in, H out)",
        ),
    ),
)


# ---- Medusa -----------------------------------------------------------------------------------

def medusa_to_vllm(state: dict, num_heads: int, num_layers: int) -> dict:
    """blocks.{h}.layers.{l}.* (+ lm_heads.{h}.weight when the heads own their lm heads)."""
    out = {}
    for h in range(num_heads):
        for l in range(num_layers):
            for part in ("weight", "bias"):
                out[f"blocks.{h}.layers.{l}.{part}"] = state[f"heads.{h}.{l}.linear.{part}"]
        if f"lm_heads.{h}.weight" in state:
            out[f"lm_heads.{h}.weight"] = state[f"lm_heads.{h}.weight"]
    return out


def medusa_from_vllm(tensors: dict, num_heads: int, num_layers: int) -> dict:
    """The inverse of medusa_to_vllm (a medusa_heads. prefix is dropped)."""
    state = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("medusa_heads.")
        if m := re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", name):
            state[f"heads.{m[1]}.{m[2]}.linear.{m[3]}"] = tensor
        elif re.fullmatch(r"lm_heads\.\d+\.weight", name):
            state[name] = tensor
    return state


def write_medusa(s: SavedDrafter):
    """MedusaModel: the blocks, and the lm heads (one copy of the target's when shared; token_map for a draft
    vocabulary)."""
    h = s.head
    tensors = medusa_to_vllm(s.state, h.num_heads, h.num_layers)
    shared = h.lm_head == "shared"
    if shared:  # vLLM does not share the target's lm_head: one copy, used by every head
        tensors["lm_heads.0.weight"] = s.target_lm_head().to(s.dtype)
    target = s.config["target"]
    truncated = target["vocab_size"]
    if not shared and h.draft_vocab_size:  # own heads of the draft vocabulary's rows: vLLM's token_map
        tensors["token_map"] = draft_vocab.ids(s.state["d2t"])
        truncated = h.draft_vocab_size
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": target["hidden_size"],
              "vocab_size": target["vocab_size"], "truncated_vocab_size": truncated, "num_heads": h.num_heads,
              "num_hidden_layers": h.num_layers, "medusa_fc_bias": True, "original_lm_head": shared,
              "torch_dtype": str(s.dtype).removeprefix("torch.")}
    return tensors, config, "model.safetensors"


def read_medusa(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of a vLLM Medusa folder; an lm head equal to the target's is shared again."""
    num_heads, num_layers = int(config["num_heads"]), int(config.get("num_hidden_layers", 1))
    state = medusa_from_vllm(tensors, num_heads, num_layers)
    head = {"type": "medusa", "num_heads": num_heads, "num_layers": num_layers, "lm_head": "own"}
    vocab = target_dims(target.config).vocab_size
    draft_ids = token_map(config, tensors, vocab)
    if draft_ids is not None:  # vLLM drafts among token_map's tokens: a draft vocabulary
        head["draft_vocab_size"] = len(draft_ids)
        state["d2t"] = draft_ids - torch.arange(len(draft_ids))
        state["t2d"] = draft_vocab.members(state["d2t"], vocab)
    if config.get("original_lm_head"):
        shared = state.pop("lm_heads.0.weight")
        if torch.equal(shared.to(torch.float32),
                       target.get_output_embeddings().weight.detach().cpu().to(torch.float32)):
            return {**head, "lm_head": "shared"}, state
        # a trained shared head: keep it, per head
        state.update({f"lm_heads.{h}.weight": shared for h in range(num_heads)})
    if not any(k.startswith("lm_heads.") for k in state):
        raise DraftheadsError("this vLLM Medusa folder has no lm_heads.* tensors; it cannot be loaded")
    if draft_ids is not None:  # vLLM also takes full-vocabulary heads and keeps token_map's rows
        state.update({k: w[draft_ids] for k, w in state.items() if k.startswith("lm_heads.") and w.shape[0] == vocab})
    state["lm_heads_initialised"] = torch.tensor(True)
    return head, state


def token_map(config: dict, tensors: dict, vocab: int) -> torch.Tensor | None:
    """The target ids of a vLLM Medusa draft vocabulary (token_map, used when truncated_vocab_size < vocab_size)."""
    truncated = int(config.get("truncated_vocab_size") or vocab)
    if truncated >= vocab:
        return None
    if "token_map" not in tensors:
        raise DraftheadsError(f"this vLLM Medusa folder sets truncated_vocab_size {truncated} < {vocab} but has no "
                              "token_map tensor")
    ids = tensors["token_map"].long().flatten()
    if len(ids) != truncated or len(ids.unique()) != truncated or ids.min() < 0 or ids.max() >= vocab:
        raise DraftheadsError(f"this vLLM Medusa folder's token_map must hold {truncated} distinct token ids "
                              f"below {vocab}")
    return ids


# ---- EAGLE-1 and EAGLE-3 ----------------------------------------------------------------------

def write_eagle(s: SavedDrafter):
    """EagleLlamaForCausalLM: fc without its bias, which is folded into the attention biases (exact)."""
    tensors = eagle_to_engine(s.state, fold_fc_bias="fc.bias" in s.state)
    qkv, o = layer_biases(tensors, "layers.0.")
    config = engine_layer_config(s.target_config(), "llama", ["EagleLlamaForCausalLM"], s.dtype, attention_bias=o,
                                 qkv_bias=qkv)
    return tensors, config, "model.safetensors"


def write_eagle3(s: SavedDrafter):
    """LlamaForCausalLMEagle3 with midlayer.* names and vLLM's aux-layer numbering."""
    # vLLM captures layer i's INPUT as aux id i: our layer l's output is id l + 1
    extra = eagle3_fields(s, [layer + 1 for layer in s.head.feature_layers])
    config = engine_layer_config(s.layer_config(), "llama", ["LlamaForCausalLMEagle3"], s.dtype, **extra,
                                 tie_word_embeddings=False)
    return eagle3_to_engine(s.state, "midlayer."), config, "model.safetensors"


def write_peagle(s: SavedDrafter):
    """EAGLE-3's folder with mask_hidden (passed through by the renaming) and the mask token as pard_token."""
    tensors, config, weights = write_eagle3(s)
    return tensors, {**config, "pard_token": s.head.mask_token_id}, weights


def write_dflash(s: SavedDrafter):
    """DFlashDraftModel: the z-lab names; with a draft vocabulary its lm_head rows and d2t."""
    return dflash_to_engine(s, own_lm_head=True), dflash_config(s, own_lm_head=True), "model.safetensors"


def write_dspark(s: SavedDrafter):
    """Qwen3DSparkModel: DeepSpec's config and names; the embedding and lm_head left to vLLM's sharing of the target's,
    except a draft vocabulary's lm_head rows, which go with d2t."""
    config = dspark_config(s)
    if s.head.draft_vocab_size is not None:
        config["draft_vocab_size"] = s.head.draft_vocab_size
    return dflash_to_engine(s, own_lm_head=True), config, "model.safetensors"


def refusal(saved: SavedDrafter) -> str | None:
    """vLLM loads every layout listed here for the families and targets each lists, except DFlash and DSpark on
    targets whose embedding scale lies outside the embedding module they share."""
    scale = UNSCALED_SHARED_EMBEDDING.get(saved.family)
    if saved.kind in ("dflash", "dspark") and scale:
        return (f"vLLM's {LABELS[saved.kind]} drafter embeds its block with the {saved.family} target's embedding "
                f"table alone, without the {scale} the target's model applies and this drafter was trained with")
    return None


WRITERS = {"medusa": write_medusa, "eagle": write_eagle, "eagle3": write_eagle3, "dflash": write_dflash,
           "peagle": write_peagle, "dspark": write_dspark}

# the speculative config's method for each kind (the layouts' engines); P-EAGLE is method eagle3 + parallel_drafting
METHODS = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3", "peagle": "eagle3", "dflash": "dflash",
           "dspark": "dspark"}


def serve_command(s: SavedDrafter, model: str, target: str) -> str:
    """`vllm serve` of `target` drafting with the folder `model` (a path or hub id), at the export's draft length."""
    # DSpark: vLLM's slots are the block's, whatever draft length was asked for (a chain is cut by acceptance)
    tokens = s.head.block_size if s.kind == "dspark" else s.speculative_tokens
    config = {"method": METHODS[s.kind], "model": model, "num_speculative_tokens": tokens}
    note = ""
    if s.kind == "dspark":
        note = ("# vLLM runs DSpark on its V2 GPU model runner (VLLM_USE_V2_MODEL_RUNNER=1 where it is not the "
                "default)\n")
    if s.kind == "peagle":
        config["parallel_drafting"] = True
        note = ("# vLLM 0.34.0 refuses parallel_drafting (earlier releases take it); without it this folder drafts "
                "as EAGLE-3\n")
    return f"{note}vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(config))}"
