"""Read engine layouts and the public reference layouts into our drafters (the inverse of export.py).

folder (config.json + weights) -> which layout (detect) -> head config (structure from the
folder, training settings from draftheads_export.json when we wrote it) -> tensors renamed to
native names (heads/engine_maps.py) -> a drafter built for `target`, loaded strictly, bound.
Layouts read: vLLM / TGI / Medusa v0.1 Medusa, vLLM / SGLang / reference EAGLE-1/2, vLLM /
SGLang LlamaForCausalLMEagle3 and speculators EAGLE-3.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftheads.config import build
from draftheads.errors import DraftheadsError
from draftheads.heads import draft_vocab
from draftheads.heads import engine_maps as maps
from draftheads.heads.common import place_like, target_dims

EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
EAGLE_ARCHS = ("EagleLlamaForCausalLM", "LlamaForCausalLMEagle", "Qwen2ForCausalLMEagle")
STRUCTURE = {"medusa": ("type", "num_heads", "num_layers", "lm_head", "draft_vocab_size"), "eagle": ("type", "eagle3", "feature_layers", "draft_vocab_size")}


def import_drafter(folder: Path, config: dict, target):
    """A drafter from an engine / reference folder, checked against `target`, bound and placed."""
    layout = detect(folder, config)
    tensors = read_tensors(folder)
    if layout == "medusa-vllm":
        head, state = medusa_vllm(config, tensors, target)
    elif layout == "medusa-tgi":
        head, state = medusa_tgi(config, tensors)
    elif layout == "eagle3":
        head, state = eagle3(config, tensors, target)
    else:
        head, state = {"type": "eagle", "eagle3": False}, tensors
    head = with_saved_settings(folder, head)
    drafter = build_drafter(head, target)
    if layout == "eagle":
        state = maps.eagle_from_engine(state, set(own_keys(drafter)))
    load_strict(drafter, state, folder)
    return place_like(drafter.bind(target), target)


def detect(folder: Path, config: dict) -> str:
    archs = config.get("architectures") or []
    if "speculators_model_type" in config:
        if config["speculators_model_type"] != "eagle3":
            raise DraftheadsError(f"'{folder}': speculators model type '{config['speculators_model_type']}' is not read here (eagle3 only)")
        return "eagle3"
    if "medusa_num_heads" in config:
        return "medusa-tgi"
    if config.get("model_type") == "medusa" or "MedusaModel" in archs:
        return "medusa-vllm"
    if any(a in EAGLE3_ARCHS for a in archs):
        return "eagle3"
    if any(a in EAGLE_ARCHS for a in archs) or has_eagle_tensors(folder):
        return "eagle"
    raise DraftheadsError(
        f"'{folder}' is neither a draftheads drafter nor a layout we read (vLLM/SGLang/TGI/speculators Medusa, EAGLE, EAGLE-3)"
    )


def has_eagle_tensors(folder: Path) -> bool:
    """The public EAGLE reference layout: a Llama config beside fc.* and layers.0.* tensors."""
    try:
        names = set(read_tensors(folder))
    except DraftheadsError:
        return False
    return "fc.weight" in names and any(n.startswith("layers.0.") for n in names)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the folder: safetensors files, else a PyTorch file read with weights_only."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        out = {}
        for file in files:
            out.update(load_file(str(file)))
        return out
    for name in ("pytorch_model.bin", "medusa_lm_head.pt", "model.pt"):
        if (folder / name).is_file():
            try:
                return dict(torch.load(folder / name, map_location="cpu", weights_only=True))
            except Exception as e:  # noqa: BLE001 - torch raises many types for a bad or unsafe pickle
                raise DraftheadsError(f"cannot read {folder / name} as plain tensors ({type(e).__name__}); convert it to safetensors") from None
    raise DraftheadsError(f"'{folder}' has no weights (*.safetensors, pytorch_model.bin or medusa_lm_head.pt)")


# ---- head configs and native state per layout ------------------------------------------------

def medusa_vllm(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    num_heads, num_layers = int(config["num_heads"]), int(config.get("num_hidden_layers", 1))
    state = maps.medusa_from_vllm(tensors, num_heads, num_layers)
    head = {"type": "medusa", "num_heads": num_heads, "num_layers": num_layers, "lm_head": "own"}
    vocab = target_dims(target.config).vocab_size
    draft_ids = medusa_token_map(config, tensors, vocab)
    if draft_ids is not None:  # vLLM drafts among token_map's tokens: a draft vocabulary
        head["draft_vocab_size"] = len(draft_ids)
        state["d2t"] = draft_ids - torch.arange(len(draft_ids))
        state["t2d"] = draft_vocab.members(state["d2t"], vocab)
    if config.get("original_lm_head"):
        shared = state.pop("lm_heads.0.weight")
        if torch.equal(shared.to(torch.float32), target.get_output_embeddings().weight.detach().cpu().to(torch.float32)):
            return {**head, "lm_head": "shared"}, state
        state.update({f"lm_heads.{h}.weight": shared for h in range(num_heads)})  # a trained shared head: keep it, per head
    if not any(k.startswith("lm_heads.") for k in state):
        raise DraftheadsError("this vLLM Medusa folder has no lm_heads.* tensors; it cannot be loaded")
    if draft_ids is not None:  # vLLM also takes full-vocabulary heads and keeps token_map's rows
        state.update({k: w[draft_ids] for k, w in state.items() if k.startswith("lm_heads.") and w.shape[0] == vocab})
    state["lm_heads_initialised"] = torch.tensor(True)
    return head, state


def medusa_token_map(config: dict, tensors: dict, vocab: int) -> torch.Tensor | None:
    """The target ids of a vLLM Medusa draft vocabulary (token_map, used when truncated_vocab_size < vocab_size)."""
    truncated = int(config.get("truncated_vocab_size") or vocab)
    if truncated >= vocab:
        return None
    if "token_map" not in tensors:
        raise DraftheadsError(f"this vLLM Medusa folder sets truncated_vocab_size {truncated} < {vocab} but has no token_map tensor")
    ids = tensors["token_map"].long().flatten()
    if len(ids) != truncated or len(ids.unique()) != truncated or ids.min() < 0 or ids.max() >= vocab:
        raise DraftheadsError(f"this vLLM Medusa folder's token_map must hold {truncated} distinct token ids below {vocab}")
    return ids


def medusa_tgi(config: dict, tensors: dict) -> tuple[dict, dict]:
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    state = maps.medusa_from_tgi(tensors, num_layers)
    own = any(k.startswith("lm_heads.") for k in state)
    if own:
        state["lm_heads_initialised"] = torch.tensor(True)
    return {"type": "medusa", "num_heads": num_heads, "num_layers": num_layers, "lm_head": "own" if own else "shared"}, state


def eagle3(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    state = maps.eagle3_from_engine(tensors)
    num_layers = target_dims(target.config).num_layers
    if "eagle_config" in config and "eagle_aux_hidden_state_layer_ids" in config["eagle_config"]:
        layers = list(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])  # SGLang: layer outputs
    elif config.get("eagle_aux_hidden_state_layer_ids"):
        layers = [i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]  # vLLM / speculators: hidden_states index
    else:
        layers = [1, num_layers // 2 - 1, num_layers - 4]  # the engines' default ids (2, N//2, N-3) are layer inputs
    if "lm_head.weight" not in state:
        raise DraftheadsError("this EAGLE-3 folder has no lm_head.weight; it cannot be loaded")
    vocab = target_dims(target.config).vocab_size
    size = int(config.get("draft_vocab_size") or state["lm_head.weight"].shape[0])
    if "d2t" not in state:  # a full-vocabulary head carries no maps
        state["d2t"] = torch.zeros(size, dtype=torch.long)
    if "t2d" not in state:
        state["t2d"] = draft_vocab.members(state["d2t"], vocab)
    return {"type": "eagle", "eagle3": True, "feature_layers": layers, "draft_vocab_size": size}, state


def with_saved_settings(folder: Path, head: dict) -> dict:
    """Training settings (losses, default tree, ...) from draftheads_export.json when we wrote the folder;
    the structure always comes from the folder itself."""
    record = folder / "draftheads_export.json"
    if not record.is_file():
        return head
    saved = json.loads(record.read_text()).get("head") or {}
    if saved.get("type") != head["type"]:
        return head
    structure = STRUCTURE[head["type"]]
    return {**{k: v for k, v in saved.items() if k not in structure}, **head}


# ---- building and loading ---------------------------------------------------------------------

def build_drafter(head: dict, target):
    from draftheads.heads import HEAD_CONFIGS, HEAD_TYPES

    cfg = build(HEAD_CONFIGS[head["type"]], head, "head")
    if hasattr(cfg, "resolve"):
        dims = target_dims(target.config)
        cfg.resolve(dims.num_layers, dims.vocab_size)
    return HEAD_TYPES[head["type"]].from_target(target.config, cfg)


def own_keys(drafter) -> list[str]:
    skip = tuple(getattr(drafter, "unsaved_prefixes", ()))
    return [k for k in drafter.state_dict() if not (skip and k.startswith(skip))]


def load_strict(drafter, state: dict, folder: Path) -> None:
    """Every drafter tensor must come from the folder, with its shape; a bias the target's layer has
    but the (Llama-style) checkpoint lacks is zero, which is what a missing bias means."""
    expected = drafter.state_dict()
    keys = set(own_keys(drafter))
    for key in sorted(keys - set(state)):
        if key.endswith(".bias") and key.startswith("layer."):
            state[key] = torch.zeros_like(expected[key])
    missing, unexpected = sorted(keys - set(state)), sorted(set(state) - keys)
    if missing or unexpected:
        parts = ([f"missing {missing[:3]}"] if missing else []) + ([f"unexpected {unexpected[:3]}"] if unexpected else [])
        raise DraftheadsError(f"'{folder}' does not fit a drafter for this target ({'; '.join(parts)})")
    for key in keys:
        if tuple(state[key].shape) != tuple(expected[key].shape):
            raise DraftheadsError(
                f"'{folder}': {key} has shape {tuple(state[key].shape)} but this target needs {tuple(expected[key].shape)}; "
                "it was trained for another target"
            )
    drafter.load_state_dict({k: state[k].to(expected[k].dtype) for k in keys}, strict=False)
