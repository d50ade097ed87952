"""The EAGLE family's tensor layout: the EAGLE and EAGLE-3 reference repositories' names, which
vLLM, SGLang and speculators adopted, with the one exact re-parametrisation vLLM's EAGLE-1 needs.

Native names (heads/eagle.py, heads/eagle3.py):
  EAGLE-1/2  fc.{weight,bias}, layer.* (input_layernorm is the identity, so absent)
  EAGLE-3    fc.weight, layer.* (layer.input_layernorm normalises h), embed_norm (normalises the
             embedding), norm, lm_head, d2t, t2d
Engine names: a Llama-style decoder layer under `layers.0.` (EAGLE-1, speculators' EAGLE-3) or
`midlayer.` (vLLM / SGLang EAGLE-3), where EAGLE-3's `hidden_norm` normalises h and its
`input_layernorm` the embedding. Also here: the one-layer config.json the engines build the draft
layer from, and the readers of public EAGLE-1 and EAGLE-3 folders (any of the engines' layouts).
"""

from __future__ import annotations

import re

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.heads.parts import draft_vocab
from draftheads.heads.eagle3 import default_feature_layers
from draftheads.core.target_family import one_layer_config, whole_head_rope
from draftheads.interop.layout import Tensor

ATTN = ("q_proj", "k_proj", "v_proj")
EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
EAGLE_ARCHS = ("EagleLlamaForCausalLM", "LlamaForCausalLMEagle", "Qwen2ForCausalLMEagle")


# ---- tensor specs (interop/layout.py) ---------------------------------------------------------

def llama_layer(prefix: str, attn_in: str, input_norm: bool) -> tuple[Tensor, ...]:
    """A Llama-style decoder layer as HF names it (prefix "layers.0." or "midlayer."); q/k/v take
    `attn_in` features (H for EAGLE-1, 2H for EAGLE-3's [norm(emb); norm(h)])."""
    p = prefix
    out = [
        Tensor(f"{p}self_attn.q_proj.weight", ("Q", attn_in)),
        Tensor(f"{p}self_attn.k_proj.weight", ("KV", attn_in)),
        Tensor(f"{p}self_attn.v_proj.weight", ("KV", attn_in)),
        Tensor(f"{p}self_attn.o_proj.weight", ("H", "Q")),
        Tensor(f"{p}self_attn.q_proj.bias", ("Q",), when="qkv_bias"),
        Tensor(f"{p}self_attn.k_proj.bias", ("KV",), when="qkv_bias"),
        Tensor(f"{p}self_attn.v_proj.bias", ("KV",), when="qkv_bias"),
        Tensor(f"{p}self_attn.o_proj.bias", ("H",), when="o_bias"),
        Tensor(f"{p}self_attn.q_norm.weight", ("D",), when="qk_norm"),
        Tensor(f"{p}self_attn.k_norm.weight", ("D",), when="qk_norm"),
        Tensor(f"{p}mlp.gate_proj.weight", ("I", "H")),
        Tensor(f"{p}mlp.up_proj.weight", ("I", "H")),
        Tensor(f"{p}mlp.down_proj.weight", ("H", "I")),
        Tensor(f"{p}post_attention_layernorm.weight", ("H",)),
    ]
    if input_norm:
        out.append(Tensor(f"{p}input_layernorm.weight", ("H",)))
    return tuple(out)


def eagle3_tensors(prefix: str) -> tuple[Tensor, ...]:
    """EAGLE-3: fc over three fused target layers, one layer over [input_layernorm(emb); hidden_norm(h)]."""
    return (
        (Tensor("fc.weight", ("H", "3H")), Tensor(f"{prefix}hidden_norm.weight", ("H",)),
         Tensor(f"{prefix}input_layernorm.weight", ("H",)))
        + llama_layer(prefix, "2H", input_norm=False)
        + (
            Tensor("norm.weight", ("H",)),
            Tensor("lm_head.weight", ("Vd", "H")),
            Tensor("d2t", ("Vd",), dtype="int64"),
            Tensor("t2d", ("V",), dtype="bool"),
        )
    )


# ---- EAGLE-1/2 names ----------------------------------------------------------------------------

def eagle_to_engine(state: dict, fold_fc_bias: bool) -> dict:
    """fc + layers.0.*; with `fold_fc_bias` the fc bias moves into the attention biases (vLLM).

    A draft vocabulary (d2t/t2d) is left out: EAGLE-1 engines draft with the target's whole lm_head,
    whose rows the draft vocabulary only selects, so the exported layer drafts a superset."""
    out = {name.replace("layer.", "layers.0.", 1) if name.startswith("layer.") else name: t for name, t in state.items()
           if name not in ("d2t", "t2d")}
    if fold_fc_bias:
        fold_fc_bias_into_attention(out)
    return out


def fold_fc_bias_into_attention(tensors: dict) -> None:
    """Rewrite fc(x) = W x + b as W x, exactly, for a layer without an input norm.

    The layer computes r = x + o_proj(attn(q_proj x, k_proj x, v_proj x)), so with x = W z + b:
    p_proj x = p_proj(W z) + P b for p in q/k/v (add P b to their biases), and the residual's b is
    o_proj's output plus b (add b to o_proj's bias). Everything after r is unchanged.
    """
    b = tensors.pop("fc.bias").double()
    for proj in ATTN:
        weight = tensors[f"layers.0.self_attn.{proj}.weight"]
        key = f"layers.0.self_attn.{proj}.bias"
        base = tensors[key].double() if key in tensors else torch.zeros(weight.shape[0], dtype=torch.float64)
        tensors[key] = (base + weight.double() @ b).to(weight.dtype)
    key = "layers.0.self_attn.o_proj.bias"
    base = tensors[key].double() if key in tensors else torch.zeros_like(b)
    tensors[key] = (base + b).to(tensors["fc.weight"].dtype)


def eagle_from_engine(tensors: dict, own_keys: set[str]) -> dict:
    """Engine EAGLE-1 tensors -> native names, undoing a folded fc bias when the file has one.

    `own_keys` are the drafter's state-dict keys: a bias the target's layer does not have must
    come from the fold (or be zero), otherwise the checkpoint cannot be represented.
    """
    state = {}
    for name, tensor in tensors.items():
        if name.startswith("layers.0."):
            state["layer." + name.removeprefix("layers.0.")] = tensor
        elif name.startswith("fc."):
            state[name] = tensor
    if "fc.bias" not in state and "fc.bias" in own_keys:
        unfold_fc_bias(state, own_keys)
    return state


def unfold_fc_bias(state: dict, own_keys: set[str]) -> None:
    """Inverse of the fold: fc.bias = o_proj's bias (the target layer has none); q/k/v keep the rest."""
    weight = state["fc.weight"]
    o_key = "layer.self_attn.o_proj.bias"
    b = (state.pop(o_key).double() if o_key in state and o_key not in own_keys
         else torch.zeros(weight.shape[0], dtype=torch.float64))
    state["fc.bias"] = b.to(weight.dtype)
    for proj in ATTN:
        key = f"layer.self_attn.{proj}.bias"
        if key not in state:
            continue
        rest = state[key].double() - state[f"layer.self_attn.{proj}.weight"].double() @ b
        if key in own_keys:
            state[key] = rest.to(weight.dtype)
        elif rest.abs().max() <= 1e-4 * (1 + state[key].double().abs().max()):
            del state[key]
        else:
            raise DraftheadsError(
                f"this EAGLE checkpoint has a {proj} bias the target's decoder layer cannot hold; "
                "it was trained for another target family"
            )


# ---- EAGLE-3 names ----------------------------------------------------------------------------

def eagle3_to_engine(state: dict, prefix: str) -> dict:
    """prefix 'midlayer.' (vLLM / SGLang) or 'layers.0.' (speculators)."""
    out = {}
    for name, tensor in state.items():
        if name == "layer.input_layernorm.weight":
            out[f"{prefix}hidden_norm.weight"] = tensor
        elif name == "embed_norm.weight":
            out[f"{prefix}input_layernorm.weight"] = tensor
        elif name.startswith("layer."):
            out[prefix + name.removeprefix("layer.")] = tensor
        else:
            out[name] = tensor
    return out


def eagle3_from_engine(tensors: dict) -> dict:
    state = {}
    for name, tensor in tensors.items():
        layer = re.match(r"(midlayer\.|layers\.0\.)(.*)", name)
        if layer and layer[2] == "hidden_norm.weight":
            state["layer.input_layernorm.weight"] = tensor
        elif layer and layer[2] == "input_layernorm.weight":
            state["embed_norm.weight"] = tensor
        elif layer:
            state["layer." + layer[2]] = tensor
        elif name in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "mask_hidden"):
            state[name] = tensor
    return state


# ---- the engines' config.json for the draft layer -----------------------------------------------

LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "hidden_act", "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_parameters",
                "bos_token_id", "eos_token_id", "pad_token_id")


def engine_layer_config(target, model_type: str, architectures: list[str], dtype: torch.dtype, **extra) -> dict:
    """A one-layer config of `model_type` carrying the target's attention, MLP, rope and norm sizes."""
    target = one_layer_config(target)   # its global layer's sizes (Gemma 4's differ by layer type)
    d = {k: getattr(target, k) for k in LAYER_FIELDS if getattr(target, k, None) is not None}
    d.setdefault("head_dim", target.hidden_size // target.num_attention_heads)
    rope = whole_head_rope(target) or {}   # Gemma 3 keeps one set per layer type; the draft layer is full attention
    if "rope_parameters" in d:
        d["rope_parameters"] = rope
    if "rope_theta" in rope or getattr(target, "rope_theta", None) is not None:
        d["rope_theta"] = rope.get("rope_theta", getattr(target, "rope_theta", None))  # older loaders read rope_theta
    d["rope_scaling"] = rope_scaling(rope)
    name = str(dtype).removeprefix("torch.")
    d.update(model_type=model_type, architectures=architectures, num_hidden_layers=1,
             tie_word_embeddings=bool(getattr(target, "tie_word_embeddings", False)), torch_dtype=name, dtype=name)
    d.update(extra)
    return d


def rope_scaling(rope: dict) -> dict | None:
    """transformers 4.x's `rope_scaling` for `rope_parameters` (None for plain RoPE): what loaders pinned to it read
    (SGLang, older vLLM), which ignore rope_parameters and would otherwise run a Llama-3.1 drafter with plain RoPE."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
    return {**scaling, "rope_type": kind}


def layer_biases(state: dict, prefix: str = "layer.") -> tuple[bool, bool]:
    """(q/k/v carry biases, o_proj carries a bias) in the native layer."""
    return f"{prefix}self_attn.q_proj.bias" in state, f"{prefix}self_attn.o_proj.bias" in state


def eagle3_fields(s, aux_ids: list[int]) -> dict:
    """The EAGLE-3 fields every engine's config.json carries, for a SavedDrafter `s`."""
    return {"draft_vocab_size": s.head.draft_vocab_size, "target_hidden_size": s.config["target"]["hidden_size"],
            "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": aux_ids}


# SGLang's eagle_config ids name the target layers whose OUTPUT is read: the target class adds 1 (it captures the
# input of layer id). Its DeepSeek-V2/V3 class adds 1 only when the first id is 1 and takes any other list as layer
# inputs (python/sglang/srt/models/deepseek_v2.py, set_eagle3_layers_to_capture, SGLang 0.5.23).
SGLANG_INPUT_IDS_UNLESS_ONE = ("deepseek_v2", "deepseek_v3")


def sglang_aux_ids(layers: list[int], model_type: str | None) -> list[int] | None:
    """eagle_config's ids for a drafter reading the outputs of target `layers` (None: SGLang cannot be told them)."""
    if model_type not in SGLANG_INPUT_IDS_UNLESS_ONE or layers[0] == 1:
        return list(layers)
    # as layer inputs: layer l's output is the input of layer l + 1; a list starting at layer 0 would read as 1
    return None if layers[0] == 0 else [layer + 1 for layer in layers]


def sglang_layers(ids: list[int], model_type: str | None) -> list[int]:
    """The target layers whose outputs SGLang reads for eagle_config's `ids` (the inverse of sglang_aux_ids)."""
    if model_type not in SGLANG_INPUT_IDS_UNLESS_ONE or ids[0] == 1:
        return list(ids)
    return [i - 1 for i in ids]


# ---- reading EAGLE-3 folders (vLLM, SGLang, speculators) -------------------------------------------

def read_eagle3(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of an EAGLE-3 folder: its aux layer ids in whichever of the
    engines' numberings the config uses, and d2t/t2d (made up for a full-vocabulary head)."""
    refuse_other_norms(config, tensors)
    state = eagle3_from_engine(tensors)
    num_layers = target_dims(target.config).num_layers
    if "eagle_config" in config and "eagle_aux_hidden_state_layer_ids" in config["eagle_config"]:
        layers = sglang_layers(list(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
                               getattr(target.config, "model_type", None))   # SGLang: layer outputs, mostly
    elif config.get("eagle_aux_hidden_state_layer_ids"):
        layers = [i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]  # vLLM / speculators: hidden_states index
    else:
        layers = default_feature_layers(num_layers)  # the engines' default ids (2, N//2, N-3) are layer inputs
    if "lm_head.weight" not in state:
        raise DraftheadsError("this EAGLE-3 folder has no lm_head.weight; it cannot be loaded")
    vocab = target_dims(target.config).vocab_size
    size = int(config.get("draft_vocab_size") or state["lm_head.weight"].shape[0])
    if "d2t" not in state:  # a full-vocabulary head carries no maps
        state["d2t"] = torch.zeros(size, dtype=torch.long)
    if "t2d" not in state:
        state["t2d"] = draft_vocab.members(state["d2t"], vocab)
    head = {"type": "eagle3", "feature_layers": layers, "draft_vocab_size": size}
    if has_own_layer(state):
        head["draft_layer"] = "target"
    return head, state


# speculators' variants of the EAGLE-3 layer (its trainer turns the first three on by default): each normalises
# somewhere our layer does not, so reading such a folder as ours would draft from a different model, silently.
OTHER_NORMS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def refuse_other_norms(config: dict, tensors: dict) -> None:
    used = [flag for flag in OTHER_NORMS if config.get(flag)]
    used += [name for name in tensors if re.match(r"(input_norm|fc_norm)\.", name)]
    if used:
        raise DraftheadsError(f"this EAGLE-3 folder's layer normalises where ours does not ({', '.join(used)}); "
                              "draftheads cannot draft with it: train it with speculators' --no-norm-before-residual "
                              "--no-norm-before-fc --no-norm-output, or serve it in an engine that reads these flags")


def peagle_tensors(prefix: str) -> tuple[Tensor, ...]:
    """P-EAGLE: EAGLE-3's tensors and the mask slots' hidden vector, kept before fc as vLLM and speculators do."""
    return eagle3_tensors(prefix) + (Tensor("mask_hidden", ("1", "1", "3H")),)


def read_peagle(config: dict, tensors: dict, target, mask_token_id: int | None) -> tuple[dict, dict]:
    """(head structure, native state) of a P-EAGLE folder: an EAGLE-3 folder with mask_hidden and a mask token id
    (`mask_token_id`, found by the engine module that knows where its config keeps it)."""
    head, state = read_eagle3(config, tensors, target)
    if "mask_hidden" not in state:
        raise DraftheadsError("this P-EAGLE folder has no mask_hidden tensor; it cannot be loaded")
    if mask_token_id is None:
        raise DraftheadsError("this P-EAGLE folder's config names no mask token (pard_token or mask_token_id)")
    state["mask_hidden"] = state["mask_hidden"].reshape(1, 1, -1)  # vLLM keeps it [1, 3H]
    return {**head, "type": "peagle", "mask_token_id": int(mask_token_id)}, state


def has_own_layer(state: dict) -> bool:
    """Whether the checkpoint's layer has what only a target's own class holds (q/k norms, attention biases).
    Otherwise it is Llama-shaped, what SGLang, vLLM, SpecForge and speculators' default write whatever the target,
    and loads as the Llama layer, unless our draftheads_export.json says it was the target's own (for a Llama or
    Mistral target the two hold the same tensors)."""
    return any(key.startswith("layer.") and ("q_norm" in key or "k_norm" in key or key.endswith("_proj.bias"))
               for key in state)

