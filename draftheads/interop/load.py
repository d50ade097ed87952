"""Loading a drafter folder of any kind: ours (interop/native.py), an engine's, or a public reference layout.

    drafter = load_drafter("runs/eagle-smollm2", target)     # a run folder, a drafter folder, an engine export

A foreign folder goes: which layout (detect) -> head config (structure from the folder, training
settings from draftheads_export.json when we wrote it) -> tensors renamed to native names (the
engine module's reader) -> a drafter built for `target` (heads/factory.py), loaded strictly, bound.
Layouts read: vLLM / TGI / Medusa v0.1 Medusa, vLLM / SGLang / reference EAGLE-1/2, vLLM /
SGLang LlamaForCausalLMEagle3, speculators EAGLE-3, P-EAGLE (vLLM: EAGLE-3 with mask_hidden and pard_token;
speculators: peagle), DFlash (the z-lab layout of vLLM and SGLang; speculators' dflash) and DSpark (speculators'
dspark; DeepSpec's Qwen3DSparkModel, also vLLM's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.heads.factory import head_config, new_drafter, upgrade_head
from draftheads.heads.parts.common import place_like
from draftheads.interop import deepspec, speculators, tgi, vllm
from draftheads.interop.dflash_layout import ARCHITECTURE as DFLASH_ARCHITECTURE
from draftheads.interop.dflash_layout import read_dflash
from draftheads.interop.eagle_layout import EAGLE3_ARCHS, EAGLE_ARCHS, eagle_from_engine, read_eagle3, read_peagle
from draftheads.interop.native import (FORMAT, PROVENANCE, load_native, read_config, read_export_record, read_weights,
                                      resolve_drafter_folder)

# what a folder's own tensors and config say of the head, beside which a provenance record's settings are not read
STRUCTURE = {"medusa": ("type", "num_heads", "num_layers", "lm_head", "draft_vocab_size"),
             "eagle": ("type", "draft_vocab_size"), "eagle3": ("type", "feature_layers", "draft_vocab_size"),
             "dflash": ("type", "block_size", "num_layers", "target_layers", "mask_token_id", "draft_vocab_size"),
             "dspark": ("type", "block_size", "num_layers", "target_layers", "mask_token_id", "draft_vocab_size",
                        "markov_rank", "confidence", "confidence_with_markov"),
             "peagle": ("type", "feature_layers", "draft_vocab_size", "mask_token_id")}


def load_drafter(path, target):
    """A drafter from `path` (a drafter folder of any layout, or a run folder), checked against `target`,
    bound to it and placed on its device and dtype."""
    if isinstance(target, tuple):   # load_target's (model, tokenizer), passed whole
        raise DraftheadsError("load_drafter takes the target model, and was given a tuple: pass load_target(...)[0] "
                              "(load_target returns the model and its tokenizer)")
    folder = resolve_drafter_folder(path)
    config = read_config(folder)
    if config.get("format") == FORMAT:
        return load_native(folder, config, target)
    return import_drafter(folder, config, target)


def import_drafter(folder: Path, config: dict, target):
    """A drafter from an engine / reference folder, checked against `target`, bound and placed."""
    layout = detect(folder, config)
    tensors = read_tensors(folder)
    if layout == "medusa-vllm":
        head, state = vllm.read_medusa(config, tensors, target)
    elif layout == "medusa-tgi":
        head, state = tgi.read_medusa(config, tensors)
    elif layout == "eagle3":
        head, state = read_eagle3(config, tensors, target)
    elif layout == "peagle":
        mask = next((config[k] for k in ("mask_token_id", "pard_token", "ptd_token_id") if config.get(k) is not None),
                    None)  # speculators' name, then the two vLLM reads
        head, state = read_peagle(config, tensors, target, mask)
    elif layout == "dflash":
        head, state = read_dflash(config, tensors, target)
    elif layout == "dflash-speculators":
        head, state = speculators.read_speculators_dflash(config, tensors, target)
    elif layout == "dspark-speculators":
        head, state = speculators.read_speculators_dspark(config, tensors, target)
    elif layout == "dspark":
        head, state = deepspec.read_dspark(config, tensors, target)
    else:
        head, state = {"type": "eagle"}, tensors
    drafter = new_drafter(head_config(with_saved_settings(folder, head)), target.config)
    weights = drafter.files.module
    if layout == "eagle":
        state = eagle_from_engine(state, set(weights.state_dict()))
    load_strict(weights, state, folder)
    return place_like(drafter.bind(target), target)


def detect(folder: Path, config: dict) -> str:
    archs = config.get("architectures") or []
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind not in ("eagle3", "peagle", "dflash", "dspark"):
            raise DraftheadsError(f"'{folder}': speculators model type '{kind}' is not read here (eagle3, peagle, "
                                  "dflash and dspark only)")
        return f"{kind}-speculators" if kind in ("dflash", "dspark") else kind
    if "medusa_num_heads" in config:
        return "medusa-tgi"
    if config.get("model_type") == "medusa" or "MedusaModel" in archs:
        return "medusa-vllm"
    if any(a in EAGLE3_ARCHS for a in archs):
        return "peagle" if "pard_token" in config or "ptd_token_id" in config else "eagle3"
    if DFLASH_ARCHITECTURE in archs:
        return "dflash"
    if deepspec.ARCHITECTURE in archs:
        return "dspark"
    if any(a in EAGLE_ARCHS for a in archs) or has_eagle_tensors(folder):
        return "eagle"
    raise DraftheadsError(
        f"'{folder}' is neither a draftheads drafter nor a layout we read "
        "(vLLM/SGLang/TGI/speculators Medusa, EAGLE, EAGLE-3; vLLM/SGLang DFlash; DeepSpec/vLLM/speculators DSpark)"
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
            out.update(read_weights(file))
        return out
    for name in ("pytorch_model.bin", "medusa_lm_head.pt", "model.pt"):
        if (folder / name).is_file():
            try:
                return dict(torch.load(folder / name, map_location="cpu", weights_only=True))
            except Exception as e:  # noqa: BLE001 - torch raises many types for a bad or unsafe pickle
                raise DraftheadsError(f"cannot read {folder / name} as plain tensors ({type(e).__name__}); convert it "
                                      "to safetensors") from None
    raise DraftheadsError(f"'{folder}' has no weights (*.safetensors, pytorch_model.bin or medusa_lm_head.pt)")


def with_saved_settings(folder: Path, head: dict) -> dict:
    """Training settings (losses, default tree, ...) from draftheads_export.json when we wrote the folder;
    the structure always comes from the folder itself."""
    record = folder / PROVENANCE
    if not record.is_file():
        return head
    saved, _ = upgrade_head(read_export_record(folder).get("head") or {})   # written before eagle3 was a kind
    if saved.get("type") != head["type"]:
        return head
    structure = STRUCTURE[head["type"]]
    return {**{k: v for k, v in saved.items() if k not in structure}, **head}   # a draft_layer found in the folder wins


def load_strict(module: torch.nn.Module, state: dict, folder: Path) -> None:
    """Every tensor of `module` must come from the folder, with its shape; a bias the target's layer has
    but the (Llama-style) checkpoint lacks is zero, which is what a missing bias means."""
    expected = module.state_dict()
    keys = set(expected)
    for key in sorted(keys - set(state)):
        if key.endswith(".bias") and key.startswith("layer."):
            state[key] = torch.zeros_like(expected[key])
    missing, unexpected = sorted(keys - set(state)), sorted(set(state) - keys)
    if missing or unexpected:
        parts = (([f"missing {missing[:3]}"] if missing else [])
                 + ([f"unexpected {unexpected[:3]}"] if unexpected else []))
        raise DraftheadsError(f"'{folder}' does not fit a drafter for this target ({'; '.join(parts)})")
    for key in keys:
        if tuple(state[key].shape) != tuple(expected[key].shape):
            raise DraftheadsError(
                f"'{folder}': {key} has shape {tuple(state[key].shape)} but this target needs "
                f"{tuple(expected[key].shape)}; it was trained for another target"
            )
    module.load_state_dict({k: state[k].to(expected[k].dtype) for k in keys}, strict=False)
