"""speculators (0.9.0, and vLLM's speculators loader): EAGLE-3 folders (`Eagle3Speculator`) and P-EAGLE folders
(`PEagleSpeculator`: EAGLE-3's and mask_hidden), whose tensor names are the public EAGLE-3 layout's under `layers.0.`
(interop/eagle_layout.py), DFlash folders (`DFlashSpeculator`: z-lab's tensor names, interop/dflash_layout.py,
with speculators' own config), DSpark folders (`DSparkSpeculator`: DFlash's with the Markov and confidence heads under
DeepSpec's names) and Qwen MTP layers (`MTPDraftModel`).
"""

from __future__ import annotations

import shlex

from draftheads.core.errors import DraftheadsError
from draftheads.heads.native_mtp import merged_state
from draftheads.interop.dflash_layout import dflash_tensors, dflash_to_engine, read_dflash, refuse_other_dspark
from draftheads.interop.eagle_layout import (
    eagle3_fields,
    eagle3_tensors,
    eagle3_to_engine,
    engine_layer_config,
    peagle_tensors,
)
from draftheads.interop.layout import SPECULATORS, VLLM, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config schema we write

LAYOUTS = (
    Layout(
        format="speculators", kind="eagle3", engine="speculators 0.9.0 / vLLM speculators loader",
        weights_file="model.safetensors",
        architectures=("Eagle3Speculator",),
        config={
            "speculators_model_type": "eagle3",
            "transformer_layer_config": "the layer's config (model_type llama or qwen3)",
            "speculators_config": "{algorithm, proposal_methods: [{proposal_type: greedy, speculative_tokens}], "
            "default_proposal_method, verifier: {name_or_path, architectures}}",
            "draft_vocab_size": "Vd", "target_hidden_size": "H", "norm_before_residual": "false, written explicitly",
            "eagle_aux_hidden_state_layer_ids": "hidden_states indices (as vLLM): layer l's output is l + 1",
        },
        tensors=eagle3_tensors("layers.0."),
        families=("llama", "mistral", "qwen3"),
        read_from=(
            LoaderFile(SPECULATORS, "src/speculators/config.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/model.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/eagle3/core.py", "PyPI speculators==0.9.0"),
            LoaderFile(VLLM, "vllm/transformers_utils/configs/speculators/base.py",
                       "94699746757f9d68e2f4bd89ad2c4b10ed962457"),
            LoaderFile(VLLM, "vllm/transformers_utils/configs/speculators/algos.py", "stored file id 54858736156"),
        ),
        traps=(
            "the speculators model starts lm_head/embeddings as NaN and keeps NaN for anything not loaded",
            "vLLM's speculators path defaults norm_before_residual to TRUE when the key is absent (speculators: false)",
            "only transformer_layer_config.model_type llama or qwen3 has an EAGLE-3 first-layer class",
            "speculators 0.9.0 has no EAGLE-1 model type",
            "the verifier is recorded (name_or_path, architectures: 'used to validate ... if needed') and never "
            "checked: any target; vLLM serving the folder needs its target class to give hidden states (vllm.py)",
        ),
    ),
    Layout(
        format="speculators", kind="peagle", engine="speculators 0.9.0 (PEagleDraftModel) / vLLM speculators loader",
        weights_file="model.safetensors",
        architectures=("PEagleSpeculator",),
        config={
            "speculators_model_type": "peagle",
            "(EAGLE-3's)": "transformer_layer_config, draft_vocab_size, target_hidden_size, norm_before_residual, "
                           "eagle_aux_hidden_state_layer_ids (hidden_states indices)",
            "mask_token_id": "the mask slots' token id",
            "speculators_config": "{algorithm: peagle, proposal_methods: [{greedy, speculative_tokens: depths}], ...}",
        },
        tensors=peagle_tensors("layers.0."),
        families=("llama", "mistral", "qwen3"),
        read_from=(
            LoaderFile(SPECULATORS, "src/speculators/models/peagle/config.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/peagle/core.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/eagle3/core.py", "PyPI speculators==0.9.0"),
        ),
        traps=(
            "mask_hidden is [1, 1, 3H] and listed as may-be-missing: a folder without it loads with a random vector",
            "mask_token_id defaults to None (no mask slots) when absent",
        ),
    ),
    Layout(
        format="speculators", kind="dflash", engine="speculators 0.9.0 (DFlashDraftModel)",
        weights_file="model.safetensors",
        architectures=("DFlashSpeculator",),
        config={
            "speculators_model_type": "dflash",
            "transformer_layer_config": "Qwen3 config of the draft layers (num_hidden_layers = draft layers)",
            "draft_vocab_size": "Vd, or the target's vocabulary size (then no lm_head, d2t or t2d in the folder)",
            "block_size": "B", "target_hidden_size": "H", "mask_token_id": "the block's mask slots",
            "aux_hidden_state_layer_ids": "hidden_states indices: z-lab's target_layer_ids + 1",
            "sample_from_anchor": "false: slot 0 is the pending token, B - 1 drafts",
        },
        tensors=dflash_tensors(own_lm_head=True) + (Tensor("t2d", ("V",), "bool", when="draft_vocab_size < V"),),
        families=(),
        read_from=(
            LoaderFile(SPECULATORS, "src/speculators/models/dflash/config.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/dflash/core.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/model.py", "PyPI speculators==0.9.0"),
        ),
        traps=(
            "draft_vocab_size defaults to 32000: always written (equal to the target's vocabulary: no own lm_head)",
            "embed_tokens and the full-vocabulary lm_head are reloaded from the verifier at from_pretrained",
            "aux_hidden_state_layer_ids are one above z-lab's target_layer_ids",
        ),
    ),
    Layout(
        format="speculators", kind="dspark", engine="speculators 0.9.0 (DSparkDraftModel)",
        weights_file="model.safetensors",
        architectures=("DSparkSpeculator",),
        config={
            "speculators_model_type": "dspark",
            "(DFlash's)": "transformer_layer_config, draft_vocab_size, block_size, target_hidden_size, mask_token_id, "
                          "aux_hidden_state_layer_ids (z-lab's target_layer_ids + 1)",
            "sample_from_anchor": "true: every slot drafts, block_size drafts (DeepSpec's convention, its default)",
            "markov_rank": "r (0: no Markov head)", "markov_head_type": "vanilla (the first-order bias we train)",
            "enable_confidence_head": "whether confidence_head.proj is in the folder",
            "confidence_head_with_markov": "the confidence head reads [h; W1[prev]]",
        },
        tensors=dflash_tensors(own_lm_head=True) + (
            Tensor("t2d", ("V",), "bool", when="draft_vocab_size < V"),
            Tensor("markov_head.markov_w1.weight", ("V", "r"), when="markov_rank > 0"),
            Tensor("markov_head.markov_w2.weight", ("Vd", "r"), when="markov_rank > 0"),
            Tensor("confidence_head.proj.weight", ("1", "H+r"), when="confidence head"),
            Tensor("confidence_head.proj.bias", ("1",), when="confidence head")),
        families=(),
        read_from=(
            LoaderFile(SPECULATORS, "src/speculators/models/dspark/config.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/dspark/core.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/dspark/model_definitions.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/dflash/core.py", "PyPI speculators==0.9.0"),
        ),
        traps=(
            "markov_w2 has the draft vocabulary's rows (W1 the verifier's): the bias adds onto the draft logits",
            "sample_from_anchor defaults to true here (false in DFlash): slot k predicts token p+k+1 and its Markov "
            "bias reads the token at p+k",
            "confidence_head_with_markov without a Markov head is refused by its constructor",
        ),
    ),
    Layout(
        format="speculators", kind="native", engine="speculators 0.9.0 (MTPDraftModel) / vLLM's MTP loaders",
        weights_file="model.safetensors",
        architectures=("MTPDraftModel",),
        config={"speculators_model_type": "mtp", "num_nextn_predict_layers": "1 (the only value it takes)",
                "transformer_layer_config": "the target's text config (qwen3_next, qwen3_5_text, qwen3_5_moe_text)",
                "speculators_config": "as EAGLE-3's: greedy proposal of the drafter's depth, the verifier"},
        tensors=(Tensor("mtp_layers.0.input_proj.weight", ("H", "2H")),   # [token_layernorm(emb); hidden_layernorm(h)]
                 Tensor("mtp_layers.0.token_layernorm.weight", ("H",)),
                 Tensor("mtp_layers.0.hidden_layernorm.weight", ("H",)),
                 Tensor("mtp_layers.0.final_layernorm.weight", ("H",))),
        families=("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
        read_from=(
            LoaderFile(SPECULATORS, "src/speculators/models/mtp/config.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/mtp/core.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/models/mtp/model_definitions.py", "PyPI speculators==0.9.0"),
            LoaderFile(SPECULATORS, "src/speculators/convert/mtp/converter.py", "PyPI speculators==0.9.0"),
        ),
        traps=(
            "MTPLayerMixin returns final_layernorm(output): the next step and the lm_head both read the normed output",
            "embed_tokens and lm_head are NaN until from_pretrained reloads them from the verifier's folder",
            "experts are transformers' fused gate_up_proj / down_proj (its converter stacks the checkpoint's)",
            "num_nextn_predict_layers other than 1 is refused by its config validator",
        ),
    ),
)


# our native MTP module's parts -> speculators' MTPLayerMixin names (the decoder layer's own names are kept)
MTP_PARTS = {"proj": "input_proj", "out_norm": "final_layernorm", "hnorm": "hidden_layernorm",
             "enorm": "token_layernorm", "layer": None}


def speculators_fields(s: SavedDrafter, kind: str, architecture: str, layer: dict, tokens: int) -> dict:
    """What every speculators config.json carries: the model type, the draft layers' config (without architectures),
    a greedy proposal method of `tokens` drafts, the verifier and the dtype."""
    layer = {k: v for k, v in layer.items() if k != "architectures"}
    verifier_arch = (s.config.get("target") or {}).get("architecture")
    dtype = str(s.dtype).removeprefix("torch.")
    return {
        "architectures": [architecture], "speculators_model_type": kind, "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": s.target_name(), "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": dtype, "dtype": dtype,
    }


def write_eagle3(s: SavedDrafter, kind: str = "eagle3", architecture: str = "Eagle3Speculator"):
    """Eagle3Speculator: the layer's own config, vLLM's aux-layer numbering, a greedy proposal method."""
    model_type = "qwen3" if s.layer_family == "qwen3" else "llama"
    layer = engine_layer_config(s.layer_config(), model_type, [], s.dtype, attention_bias=False,
                                tie_word_embeddings=False)
    config = {**speculators_fields(s, kind, architecture, layer, s.speculative_tokens),
              **eagle3_fields(s, [layer_id + 1 for layer_id in s.head.feature_layers])}  # vLLM's numbering
    return eagle3_to_engine(s.state, "layers.0."), config, "model.safetensors"


def write_dflash(s: SavedDrafter):
    """DFlashSpeculator: z-lab's tensor names; the draft layers' Qwen3 config, hidden_states-index layer ids, and the
    draft vocabulary's lm_head rows with d2t/t2d (speculators reloads the full-vocabulary head from the verifier)."""
    head = s.head
    layers = head.num_layers
    layer = engine_layer_config(s.target_config(), "qwen3", [], s.dtype, num_hidden_layers=layers,
                                attention_bias=False, tie_word_embeddings=False, hidden_act="silu",
                                use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * layers)
    tensors = dflash_to_engine(s, own_lm_head=True)
    if "t2d" in s.state:
        tensors["t2d"] = s.state["t2d"]
    config = {
        **speculators_fields(s, "dflash", "DFlashSpeculator", layer, head.block_size - 1),
        "draft_vocab_size": head.draft_vocab_size or int(s.config["target"]["vocab_size"]),
        "block_size": head.block_size, "target_hidden_size": s.config["target"]["hidden_size"],
        # hidden_states indices, as its EAGLE-3 ids: layer l's output is id l + 1 (z-lab's target_layer_ids + 1)
        "aux_hidden_state_layer_ids": [layer_id + 1 for layer_id in head.target_layers],
        "mask_token_id": head.mask_token_id, "sliding_window_non_causal": False, "sample_from_anchor": False,
    }
    return tensors, config, "model.safetensors"


def write_dspark(s: SavedDrafter):
    """DSparkSpeculator: DFlash's folder, every slot drafting (sample_from_anchor: true, block_size drafts), with the
    Markov head (markov_head.markov_w1 [V, r], markov_w2 [Vd, r]) and the confidence head under their own names."""
    head = s.head
    tensors, config, weights = write_dflash(s)
    config = {**config, **speculators_fields(s, "dspark", "DSparkSpeculator", config["transformer_layer_config"],
                                             head.block_size),
              "sample_from_anchor": True, "markov_rank": head.markov_rank, "markov_head_type": "vanilla",
              "enable_confidence_head": head.confidence,
              "confidence_head_with_markov": head.confidence and head.confidence_with_markov}
    return tensors, config, weights


def read_speculators_dflash(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of a speculators DFlash folder: its fields in z-lab's terms, then z-lab's
    reader (the same tensor names)."""
    missing = [k for k in ("aux_hidden_state_layer_ids", "mask_token_id", "block_size") if config.get(k) is None]
    if missing:
        raise DraftheadsError(f"this speculators DFlash folder's config.json lacks {', '.join(missing)}; without them "
                              "the drafter cannot be run as it was trained")
    if config.get("sample_from_anchor"):
        raise DraftheadsError("this speculators DFlash folder drafts from the anchor slot too (sample_from_anchor: "
                              "true), which draftheads' DFlash does not; train it with sample_from_anchor false")
    zlab = {"dflash_config": {"target_layer_ids": [i - 1 for i in config["aux_hidden_state_layer_ids"]],
                              "block_size": config["block_size"], "mask_token_id": config["mask_token_id"]},
            "num_hidden_layers": config["transformer_layer_config"]["num_hidden_layers"]}
    return read_dflash(zlab, {k: v for k, v in tensors.items() if not k.startswith("verifier_")}, target)


def read_speculators_dspark(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of a speculators DSpark folder: DFlash's reading, every slot drafting, and the
    Markov and confidence heads under the same names as ours."""
    rank = int(config.get("markov_rank", 256))   # speculators' default
    refuse_other_dspark(config, rank, "this speculators DSpark folder")
    heads = ("markov_head.", "confidence_head.")
    dflash = {k: v for k, v in tensors.items() if not k.startswith(heads)}
    head, state = read_speculators_dflash({**config, "sample_from_anchor": False}, dflash, target)
    confidence = bool(config.get("enable_confidence_head", True))
    head.update(type="dspark", markov_rank=rank, confidence=confidence,
                confidence_with_markov=confidence and bool(config.get("confidence_head_with_markov", True)))
    state.update({k: v for k, v in tensors.items() if k.startswith(heads)})
    return head, state


def write_peagle(s: SavedDrafter):
    """PEagleSpeculator: EAGLE-3's folder with mask_hidden and the mask token; its proposal length is
    s.speculative_tokens (the depths, unless given)."""
    tensors, config, weights = write_eagle3(s, "peagle", "PEagleSpeculator")
    return tensors, {**config, "mask_token_id": s.head.mask_token_id}, weights


def write_mtp(s: SavedDrafter):
    """MTPDraftModel: a Qwen MTP layer shipped with its target (head.type native) under mtp_layers.0., the target's
    whole text config as its layer config (speculators builds the layer at its last full_attention index)."""
    target = s.target_config().to_dict()
    layer = {k: v for k, v in target.items() if k not in ("architectures", "transformers_version")}
    tensors = {}
    for key, value in merged_state(s.state, s.head).items():   # LoRA adapters folded into their weights
        _, _, part, rest = key.split(".", 3)
        tensors[f"mtp_layers.0.{rest}" if part == "layer" else f"mtp_layers.0.{MTP_PARTS[part]}.{rest}"] = value
    config = {**speculators_fields(s, "mtp", "MTPDraftModel", layer, s.speculative_tokens),
              "num_nextn_predict_layers": 1}
    return tensors, config, "model.safetensors"


def refusal(saved: SavedDrafter) -> str | None:
    """speculators loads its layout for the families it lists; its MTP step reads the normed output."""
    if saved.kind == "native" and saved.head.normed_carry is False:
        return ("speculators' MTPDraftModel feeds each step the module's normed output; this drafter was trained on "
                "the raw one (head.normed_carry: false)")
    return None


WRITERS = {"eagle3": write_eagle3, "peagle": write_peagle, "dflash": write_dflash, "dspark": write_dspark,
           "native": write_mtp}


def serve_command(s: SavedDrafter, model: str, target: str) -> str:
    """vLLM given the speculators folder `model` alone: its speculators_config names the verifier (the target) and
    the draft length."""
    return f"vllm serve {shlex.quote(model)}"
