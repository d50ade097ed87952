"""The native drafter format: a folder with `model.safetensors` + `config.json` (+ `adapter/`).

config.json = {"format": "draftheads", "draftheads_version", "head": {every hyper-parameter},
               "target": {name, revision, architecture, model_type, hidden_size, vocab_size, num_layers},
               "feature_layers": [...], "extra": {...}}
model.safetensors holds only the drafter's own tensors (never the target's shared modules).
A Medusa-2 drafter adds `adapter/` (its LoRA adapter in PEFT format). Weights are never pickled.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftheads.config import build, to_dict
from draftheads.errors import DraftheadsError
from draftheads.heads.common import place_like, target_summary

FORMAT = "draftheads"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
ADAPTER = "adapter"
CHECKED = ("architecture", "hidden_size", "vocab_size")  # a mismatch here means the drafter cannot work


def own_state_dict(drafter: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that belong to the drafter, contiguous on CPU, each with its own storage."""
    skip = tuple(getattr(drafter, "unsaved_prefixes", ()))
    out, seen = {}, set()
    for name, tensor in drafter.state_dict().items():
        if skip and name.startswith(skip):
            continue
        tensor = tensor.detach().cpu().contiguous()
        if tensor.untyped_storage().data_ptr() in seen:  # tied tensors: safetensors refuses shared storage
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def save_drafter(drafter: torch.nn.Module, folder, target=None, extra: dict | None = None) -> Path:
    """Write the drafter to `folder` atomically (a temporary sibling folder, then a rename)."""
    from draftheads import __version__

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(own_state_dict(drafter), str(tmp / WEIGHTS), metadata={"format": "pt"})
    if getattr(drafter, "needs_target_grad", False):
        drafter.save_adapter(tmp / ADAPTER)
    config = {
        "format": FORMAT,
        "draftheads_version": __version__,
        "head": to_dict(drafter.config),
        "target": target_summary(target) if target is not None else None,
        "feature_layers": list(drafter.feature_layers),
        "extra": extra or {},
    }
    (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    _replace(tmp, folder)
    return folder


def _replace(tmp: Path, folder: Path) -> None:
    """Swap `tmp` into place; an existing folder is moved aside first and removed after."""
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def resolve_drafter_folder(path) -> Path:
    """A drafter folder from a drafter folder or a run folder (final/drafter, else the newest complete step's)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DraftheadsError(f"drafter path '{path}' does not exist; give a drafter folder or a run folder (runs/<name>)")
    if (path / CONFIG).is_file():
        return path
    from draftheads.training.checkpoint import list_checkpoints

    candidates = [path / "final" / "drafter"] + [p / "drafter" for p in reversed(list_checkpoints(path))]
    for candidate in candidates:
        if (candidate / CONFIG).is_file():
            return candidate
    raise DraftheadsError(
        f"'{path}' has no config.json; give a drafter folder (with model.safetensors + config.json) or a run folder with final/drafter/"
    )


def load_drafter(path, target):
    """A drafter from `path`, checked against `target`, bound to it and placed on its device/dtype."""
    folder = resolve_drafter_folder(path)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except json.JSONDecodeError as e:
        raise DraftheadsError(f"{folder / CONFIG} is not valid JSON ({e.msg} at line {e.lineno}); re-export the drafter") from None
    if config.get("format") != FORMAT:
        return load_foreign(folder, config, target)
    return load_native(folder, config, target)


def load_foreign(folder: Path, config: dict, target):
    """Hook for engine layouts (vLLM / SGLang / speculators / ...): dispatch on what the folder holds."""
    from draftheads.heads.importers import import_drafter

    return import_drafter(folder, config, target)


def load_native(folder: Path, config: dict, target):
    from draftheads.heads import HEAD_CONFIGS, HEAD_TYPES

    check_target(config.get("target"), target, folder)
    head = dict(config.get("head") or {})
    kind = head.get("type")
    if kind not in HEAD_TYPES:
        raise DraftheadsError(f"{folder / CONFIG}: unknown head type {kind!r}; this draftheads knows {', '.join(HEAD_TYPES)}")
    cfg = build(HEAD_CONFIGS[kind], head, "head")
    if hasattr(cfg, "resolve"):
        dims = target_summary(target)
        cfg.resolve(dims["num_layers"], dims["vocab_size"])
    drafter = HEAD_TYPES[kind].from_target(target.config, cfg)
    load_weights(drafter, folder / WEIGHTS)
    drafter.bind(target)
    if getattr(drafter, "needs_target_grad", False):
        drafter.load_adapter(folder / ADAPTER)
    return place_like(drafter, target)


def check_target(saved: dict | None, target, folder: Path) -> None:
    """Refuse a target whose architecture, hidden size or vocabulary differs from the saved one."""
    if not saved:
        return  # saved without a target: nothing to compare against
    current = target_summary(target)
    for key in CHECKED:
        if saved.get(key) is not None and saved[key] != current[key]:
            raise DraftheadsError(
                f"drafter {folder} was trained for a target with {key} {saved[key]} but this target has {key} {current[key]}; "
                f"load it with {saved.get('name') or 'the original target'}"
            )


def load_weights(drafter: torch.nn.Module, file: Path) -> None:
    """Strict load from safetensors (no pickle); missing or unexpected tensors are a one-line error."""
    if not file.is_file():
        raise DraftheadsError(f"'{file}' not found; the drafter folder is incomplete, re-export it")
    state = load_file(str(file), device="cpu")
    expected = set(own_state_dict_keys(drafter))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        parts = ([f"missing {missing[:3]}"] if missing else []) + ([f"unexpected {unexpected[:3]}"] if unexpected else [])
        raise DraftheadsError(f"{file} does not match the drafter its config.json describes ({'; '.join(parts)}); re-export it")
    try:
        drafter.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise DraftheadsError(f"{file}: {str(e).splitlines()[-1].strip()[:300]}; re-export the drafter") from None


def own_state_dict_keys(drafter: torch.nn.Module) -> list[str]:
    skip = tuple(getattr(drafter, "unsaved_prefixes", ()))
    return [k for k in drafter.state_dict() if not (skip and k.startswith(skip))]
