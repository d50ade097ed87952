"""The z-lab DFlash layout (`DFlashDraftModel`), which vLLM (`DFlashQwen3ForCausalLM`) and SGLang (`DFlashDraftModel`)
load, written and read back.

Native names (heads/dflash.py) are the layout's own: layers.{l}.self_attn.{q,k,v,o}_proj / {q,k}_norm,
layers.{l}.mlp.{gate,up,down}_proj, layers.{l}.{input,post_attention}_layernorm, fc, hidden_norm, norm; no `model.`
prefix and no embedding (the target's). The config is a Qwen3 config with the target's sizes plus the DFlash fields,
every one written explicitly, since each loader falls back silently when one is missing: `block_size` (SGLang's
default is 16), `dflash_config.target_layer_ids` (layer OUTPUTS; both engines otherwise pick their own spread),
`dflash_config.mask_token_id` (SGLang otherwise looks up a "<|MASK|>" token), the rope (vLLM otherwise assumes
theta 1e6) and `layer_types` (all full attention: bidirectional within the block in both engines). No
`eagle_aux_hidden_state_layer_ids`: vLLM reads that first, in its own numbering (an output of layer l is id l + 1).

A drafter with a draft vocabulary drafts with the target lm_head's rows for it: for vLLM those rows are written as
`lm_head.weight` [Vd, H] with `d2t` and `draft_vocab_size`; SGLang's model has no lm_head of its own and always
drafts over the target's whole vocabulary, so it gets the layers alone (the same weights, the rows of every token).
"""

from __future__ import annotations

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims, text_config
from draftheads.heads.parts import draft_vocab
from draftheads.interop.eagle_layout import engine_layer_config
from draftheads.interop.layout import Tensor

ARCHITECTURE = "DFlashDraftModel"


def dflash_tensors(own_lm_head: bool) -> tuple[Tensor, ...]:
    """The layout's tensors ({l}: draft layer); with `own_lm_head` the draft vocabulary's lm_head rows and d2t."""
    layer = "layers.{l}."
    body = (
        Tensor(layer + "self_attn.q_proj.weight", ("Q", "H")),
        Tensor(layer + "self_attn.k_proj.weight", ("KV", "H")),
        Tensor(layer + "self_attn.v_proj.weight", ("KV", "H")),
        Tensor(layer + "self_attn.o_proj.weight", ("H", "Q")),
        Tensor(layer + "self_attn.q_norm.weight", ("D",)),
        Tensor(layer + "self_attn.k_norm.weight", ("D",)),
        Tensor(layer + "mlp.gate_proj.weight", ("I", "H")),
        Tensor(layer + "mlp.up_proj.weight", ("I", "H")),
        Tensor(layer + "mlp.down_proj.weight", ("H", "I")),
        Tensor(layer + "input_layernorm.weight", ("H",)),
        Tensor(layer + "post_attention_layernorm.weight", ("H",)),
        Tensor("fc.weight", ("H", "nH")),
        Tensor("hidden_norm.weight", ("H",)),
        Tensor("norm.weight", ("H",)),
    )
    if not own_lm_head:
        return body
    return body + (Tensor("lm_head.weight", ("Vd", "H"), when="draft_vocab_size < V"),
                   Tensor("d2t", ("Vd",), "int64", when="draft_vocab_size < V"))


def dflash_config(s, own_lm_head: bool) -> dict:
    """config.json of a SavedDrafter `s` (a DFlash head) in the z-lab layout."""
    head = s.head
    num_target_layers = int(s.config["target"]["num_layers"])
    dflash = {"mask_token_id": head.mask_token_id, "target_layer_ids": list(head.target_layers),
              "block_size": head.block_size, "num_target_layers": num_target_layers}
    extra = {"num_hidden_layers": head.num_layers, "block_size": head.block_size,
             "num_target_layers": num_target_layers, "dflash_config": dflash, "hidden_act": "silu",
             "attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False,
             "sliding_window": None, "layer_types": ["full_attention"] * head.num_layers}
    if own_lm_head and head.draft_vocab_size is not None:
        extra["draft_vocab_size"] = head.draft_vocab_size
    return engine_layer_config(s.target_config(), "qwen3", [ARCHITECTURE], s.dtype, **extra)


def dflash_to_engine(s, own_lm_head: bool) -> dict:
    """Native tensors -> the layout's: the same names; the draft vocabulary's lm_head rows and d2t (vLLM), or
    nothing of the vocabulary (SGLang)."""
    out = {k: v for k, v in s.state.items() if k not in ("d2t", "t2d")}
    if own_lm_head and "d2t" in s.state:
        ids = draft_vocab.ids(s.state["d2t"])
        out["lm_head.weight"] = s.target_lm_head()[ids].to(s.dtype)
        out["d2t"] = s.state["d2t"]
    return out


def read_dflash(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of a z-lab layout DFlash folder, checked against `target`."""
    dflash = config.get("dflash_config") or {}
    layers = dflash.get("target_layer_ids")
    block = dflash.get("block_size", config.get("block_size"))
    mask = dflash.get("mask_token_id")
    missing = [name for name, value in (("dflash_config.target_layer_ids", layers), ("block_size", block),
                                        ("dflash_config.mask_token_id", mask)) if value is None]
    if missing:
        raise DraftheadsError(f"this DFlash folder's config.json lacks {', '.join(missing)}; without them the drafter "
                              "cannot be run as it was trained (write them into config.json)")
    state = {k: v for k, v in tensors.items() if k not in ("lm_head.weight", "t2d", "embed_tokens.weight")}
    head = {"type": "dflash", "block_size": int(block), "num_layers": int(config["num_hidden_layers"]),
            "target_layers": [int(i) for i in layers], "mask_token_id": int(mask)}
    if "d2t" in state:
        head["draft_vocab_size"] = int(state["d2t"].shape[0])
        if "lm_head.weight" in tensors:
            check_shared_rows(tensors["lm_head.weight"], state["d2t"], target)
        state["t2d"] = draft_vocab.members(state["d2t"], target_dims(target.config).vocab_size)
    return head, state


def check_shared_rows(lm_head: torch.Tensor, d2t: torch.Tensor, target) -> None:
    """Our DFlash drafts through the target lm_head's rows: a folder whose lm_head is something else (trained on its
    own) cannot be run that way."""
    rows = target.get_output_embeddings().weight.detach().cpu()[draft_vocab.ids(d2t)]
    if not torch.allclose(lm_head.float(), rows.float(), atol=1e-2, rtol=1e-2):
        raise DraftheadsError("this DFlash folder's lm_head is not the target's rows for its draft vocabulary (an own "
                              "lm head, which draftheads' DFlash does not have); it cannot be loaded here")


def logit_change(saved) -> str | None:
    """What the target's causal-LM class does to its logits after lm_head (core/target_family.logit_transform), which
    our DSpark applies before adding its Markov bias and no engine's DSpark does (DeepSpec, vLLM, speculators 0.9.0
    `DSparkDraftModel.forward`, llama.cpp `src/models/dflash.cpp` `build_dspark_markov_head`): None if nothing."""
    try:
        config = text_config(saved.target_config())
    except DraftheadsError:
        return None   # no target config to read: export notes it (check_fits_target)
    found = [f"{name} {getattr(config, name)}" for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
             if getattr(config, name, None) not in (None, 1, 1.0)]
    return ", ".join(found) or None


def refuse_other_dspark(config: dict, rank: int, folder: str) -> None:
    """One line when an engine DSpark folder (`folder`: whose) drafts otherwise than draftheads' DSpark: after a bonus
    anchor slot, from the mask slots only, or with a Markov head other than the first-order one."""
    if config.get("dspark_bonus_anchor"):
        raise DraftheadsError(f"{folder} drafts after a bonus anchor slot (dspark_bonus_anchor: true), which "
                              "draftheads' DSpark does not; it reads DeepSpec's block, every slot drafting")
    if config.get("sample_from_anchor") is False:
        raise DraftheadsError(f"{folder} drafts from the mask slots only (sample_from_anchor: false), which "
                              "draftheads' DSpark does not; train it with sample_from_anchor: true")
    if rank and config.get("markov_head_type", "vanilla") != "vanilla":
        raise DraftheadsError(f"{folder}'s Markov head is '{config['markov_head_type']}'; draftheads reads the "
                              "first-order one (markov_head_type: vanilla) only")
