"""The native drafter format: a folder with `model.safetensors` + `config.json` (+ what the drafter adds).

config.json = {"format": "draftheads", "draftheads_version", "head": {every hyper-parameter},
               "target": {name, revision, architecture, model_type, hidden_size, vocab_size, num_layers,
                          "settings": {what it was loaded with: dtype, device, chat_template (its text), ...}},
               "feature_layers": [...], "extra": {...}}
model.safetensors holds only the drafter's own tensors (never the target's shared modules). A
Medusa-2 drafter adds `adapter/` (its LoRA adapter in PEFT format). Weights are never pickled.
Folders are written atomically (core/folders.py). `SavedDrafter` is a folder read as plain
tensors and config: what the engine exports (interop/export.py) are written from.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from draftheads.core.config import to_dict
from draftheads.core.drafter import TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import write_folder
from draftheads.core.run_folder import drafter_candidates
from draftheads.core.state_files import read_json
from draftheads.core.target_dims import target_dims, text_config
from draftheads.core.targets import locate_target
from draftheads.core.tree import parse_tree
from draftheads.core.version import __version__
from draftheads.data.target import read_chat_template
from draftheads.heads.factory import HeadConfig, head_config, new_drafter, upgrade_head
from draftheads.heads.parts.common import place_like
from draftheads.heads.parts.layers import llama_layer_config
from draftheads.interop.gguf_targets import gguf_embedding, gguf_lm_head

FORMAT = "draftheads"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
PROVENANCE = "draftheads_export.json"  # beside every engine export (interop/export.py): where it came from
CHECKED = ("architecture", "hidden_size", "vocab_size")  # a mismatch here means the drafter cannot work
EAGLE3_KINDS = ("eagle3", "peagle")  # P-EAGLE is EAGLE-3's layer and ends plus a mask vector: the same engine layer


# ---- writing ----------------------------------------------------------------------------------


def own_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's tensors, contiguous on CPU, each with its own storage."""
    out, seen = {}, set()
    for name, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        if tensor.untyped_storage().data_ptr() in seen:  # tied tensors: safetensors refuses shared storage
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def save_drafter(drafter: TrainableDrafter, folder, target=None, extra: dict | None = None,
                 recipe: dict | None = None) -> Path:
    """Write the drafter to `folder` atomically (a temporary sibling folder, then a rename). `recipe` (the training
    recipe as a dict): its target settings are recorded, for eval and export to load the target as it was trained."""

    def fill(tmp: Path) -> None:
        save_file(own_state_dict(drafter.files.module), str(tmp / WEIGHTS), metadata={"format": "pt"})
        drafter.files.save_extras(tmp)
        config = {
            "format": FORMAT,
            "draftheads_version": __version__,
            "head": to_dict(drafter.config),
            "target": target_record(target, recipe),
            "feature_layers": list(drafter.feature_layers),
            "extra": extra or {},
        }
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")

    return write_folder(Path(folder), fill)


def target_record(target, recipe: dict | None) -> dict | None:
    """target_summary, and the recipe's target settings where there are any."""
    if target is None:
        return None
    settings = target_settings(recipe) if recipe else {}
    return {**target_summary(target), **({"settings": settings} if settings else {})}


# what a recipe's target section loads the target with, recorded as given ('auto' is resolved where it is evaluated)
LOAD_SETTINGS = ("revision", "dtype", "device", "attn_implementation")


def target_settings(recipe: dict) -> dict:
    """What a drafter's target was loaded with, from its recipe: target.revision, dtype, device, attn_implementation,
    the chat template (its text: a .jinja path would not lead there from another folder or machine), trust_remote_code
    only where the recipe turned it on, data.chat_template_kwargs and data.mode where set."""
    target, data = recipe.get("target") or {}, recipe.get("data") or {}
    out = {key: target[key] for key in LOAD_SETTINGS if target.get(key) is not None}
    if target.get("chat_template"):
        out["chat_template"] = read_chat_template(str(target["chat_template"]))
    if target.get("trust_remote_code") is True:
        out["trust_remote_code"] = True
    if data.get("chat_template_kwargs"):
        out["chat_template_kwargs"] = dict(data["chat_template_kwargs"])
    if data.get("mode") not in (None, "chat"):
        out["mode"] = data["mode"]
    return out


def recorded_settings(config: dict) -> dict:
    """The target settings a native config.json recorded ({} for folders saved before it recorded them)."""
    return dict((config.get("target") or {}).get("settings") or {})


def target_summary(target) -> dict:
    """What the native format records about the target, and checks again on load."""
    base = target.get_base_model() if hasattr(target, "get_base_model") else target  # a peft-wrapped target
    config = base.config
    dims = target_dims(config)
    return {
        "name": getattr(base, "name_or_path", None) or getattr(config, "_name_or_path", None) or None,
        "revision": getattr(config, "_commit_hash", None),
        "architecture": (getattr(config, "architectures", None) or [type(base).__name__])[0],
        "model_type": config.model_type,
        "hidden_size": dims.hidden_size,
        "vocab_size": dims.vocab_size,
        "num_layers": dims.num_layers,
    }


# ---- reading ----------------------------------------------------------------------------------


def resolve_drafter_folder(path) -> Path:
    """A drafter folder from a drafter folder or a run folder (final/drafter, else the newest complete step's)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DraftheadsError(f"drafter path '{path}' does not exist; give a drafter folder or a run folder "
                              "(runs/<name>)")
    if (path / CONFIG).is_file():
        return path
    for candidate in drafter_candidates(path):
        if (candidate / CONFIG).is_file():
            return candidate
    raise DraftheadsError(
        f"'{path}' has no config.json; "
        "give a drafter folder (with model.safetensors + config.json) or a run folder with final/drafter/"
    )


def read_config(folder: Path) -> dict:
    """config.json of a drafter folder (ours or an engine's)."""
    return read_json(folder / CONFIG, "drafter config", "re-save or re-export the drafter, or give another "
                     "checkpoint of its run")


def read_export_record(folder: Path) -> dict:
    """draftheads_export.json of an engine export we wrote: its format, source and training settings."""
    return read_json(folder / PROVENANCE, "export record", f"delete {folder} and export the drafter again")


def saved_head(config: dict, folder: Path) -> HeadConfig:
    """A native config.json's head section as its config, read as folders saved before a change were built: EAGLE-3
    and Medusa-2 as flags of EAGLE's and Medusa's configs (heads/factory.py: upgrade_head), EAGLE-3 layers of the
    target's class before head.draft_layer existed (a Llama layer by default since)."""
    head, _ = upgrade_head(dict(config.get("head") or {}))
    if head.get("type") == "eagle3" and "draft_layer" not in head:
        head["draft_layer"] = "target"
    return head_config(head, f"{folder / CONFIG}: head")


def load_native(folder: Path, config: dict, target):
    """A native drafter, checked against `target`, bound to it and placed on its device/dtype."""
    check_target(config.get("target"), target, folder)
    drafter = new_drafter(saved_head(config, folder), target.config)
    load_weights(drafter.files.module, folder / WEIGHTS)
    drafter.bind(target)
    drafter.files.load_extras(folder)
    return place_like(drafter, target)


def check_target(saved: dict | None, target, folder: Path, fix: str = "load it with") -> None:
    """Refuse a target whose architecture, hidden size or vocabulary differs from the saved one. `target` is a model
    or, where only its config is at hand (export), its config."""
    if not saved:
        return  # saved without a target: nothing to compare against
    current = target_summary(target) if isinstance(target, torch.nn.Module) else config_summary(target)
    for key in CHECKED:
        if saved.get(key) is not None and current[key] is not None and saved[key] != current[key]:
            raise DraftheadsError(
                f"drafter {folder} was trained for a target with {key} {saved[key]} but this target has {key} "
                f"{current[key]}; {fix} {saved.get('name') or 'the original target'}"
            )


def config_summary(config) -> dict:
    """target_summary's checked fields from a target's config alone (a text config may name no architecture)."""
    dims = target_dims(config)
    return {"architecture": (getattr(config, "architectures", None) or [None])[0],
            "hidden_size": dims.hidden_size, "vocab_size": dims.vocab_size}


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors on the CPU; a damaged file is a one-line error."""
    try:
        return load_file(str(file), device="cpu")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a truncated or foreign file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise DraftheadsError(f"{file} is damaged and cannot be read ({first}); re-save or re-export "
                              "the drafter") from None


def load_weights(module: torch.nn.Module, file: Path) -> None:
    """Strict load from safetensors (no pickle); missing or unexpected tensors are a one-line error."""
    if not file.is_file():
        raise DraftheadsError(f"'{file}' not found; the drafter folder is incomplete, re-export it")
    state = read_weights(file)
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        parts = (([f"missing {missing[:3]}"] if missing else [])
                 + ([f"unexpected {unexpected[:3]}"] if unexpected else []))
        raise DraftheadsError(f"{file} does not match the drafter its config.json describes ({'; '.join(parts)}); "
                              "re-export it")
    try:
        module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatch
        raise DraftheadsError(f"{file}: {str(e).splitlines()[-1].strip()[:300]}; re-export the drafter") from None


# ---- a saved drafter as data (what engine exports are written from) ------------------------------


@dataclass
class SavedDrafter:
    """A native drafter folder read as its config and tensors, plus what is known of its target."""

    folder: Path
    config: dict  # the native config.json
    head: HeadConfig  # its head section, typed
    state: dict[str, torch.Tensor]
    target_ref: object  # a loaded model, a path / hub id, or None (use the recorded target name)
    speculative_tokens_given: int | None = None
    noted: bool = field(default=False, repr=False)  # the recorded settings' note printed once
    read_target_config: object = field(default=None, repr=False)  # target_config() read from disk once

    @classmethod
    def read(cls, src, target_ref=None, dtype: torch.dtype | None = None,
             speculative_tokens: int | None = None) -> "SavedDrafter":
        """The drafter at `src`; `dtype` casts its floating-point tensors (index maps such as d2t stay integers)."""
        folder = resolve_drafter_folder(src)
        config = read_config(folder)
        if config.get("format") != FORMAT:
            raise DraftheadsError(f"'{folder}' is not a native draftheads drafter; export reads drafters trained here "
                                  "(load engine folders with load_drafter)")
        if not (folder / WEIGHTS).is_file():
            raise DraftheadsError(f"'{folder / WEIGHTS}' not found; the drafter folder is incomplete")
        state = read_weights(folder / WEIGHTS)
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return cls(folder, config, saved_head(config, folder), state, target_ref, speculative_tokens)

    @property
    def kind(self) -> str:
        """medusa, medusa2, eagle, eagle3, mtp, dflash or peagle: what engine layouts are listed by."""
        return self.head.type

    @property
    def family(self) -> str | None:
        return (self.config.get("target") or {}).get("model_type")

    @property
    def layer_family(self) -> str | None:
        """The model type of the drafter's decoder layer: llama for EAGLE-3's Llama layer, else the target's."""
        return "llama" if self.kind in EAGLE3_KINDS and self.head.draft_layer == "llama" else self.family

    @property
    def dtype(self) -> torch.dtype:
        return next(t.dtype for t in self.state.values() if t.is_floating_point())

    @property
    def speculative_tokens(self) -> int:
        """The draft length an engine should run: as given, else the one the drafter was trained for (EAGLE-3: its
        training-time-test unroll; Medusa: its heads; MTP: its modules; P-EAGLE: its depths; EAGLE-1/2: its default
        tree's depth)."""
        if self.speculative_tokens_given:
            return self.speculative_tokens_given
        h = self.head
        if self.kind == "eagle3" and h.ttt_steps > 1:
            return h.ttt_steps
        if self.kind in ("medusa", "medusa2", "mtp", "native", "assistant", "peagle"):
            return h.depth
        return parse_tree(h.default_tree).depth

    def target_name(self) -> str | None:
        if isinstance(self.target_ref, (str, os.PathLike)):
            return str(self.target_ref)
        recorded = (self.config.get("target") or {}).get("name")
        if recorded or not isinstance(self.target_ref, torch.nn.Module):
            return recorded or None
        return getattr(self.target_ref.config, "_name_or_path", None) or None

    def target_config(self):
        """The target's full (text) config: layer sizes, rope, norms for an engine's config.json."""
        if isinstance(self.target_ref, torch.nn.Module):
            return text_config(self.target_ref.config)
        if self.read_target_config is None:  # an export asks several times (fit, refusals, the engine's config)
            where, extra = self.target_location()
            try:
                self.read_target_config = text_config(AutoConfig.from_pretrained(where, **extra))
            except (OSError, ValueError) as e:
                raise DraftheadsError(f"cannot read the target config from '{self.target_name()}' "
                                      f"({str(e).splitlines()[0][:120]}); pass --target PATH") from None
        return copy.deepcopy(self.read_target_config)  # callers may edit theirs

    def layer_config(self):
        """The config of the drafter's decoder layer as the engines build it: the Llama layer EAGLE-3 uses by default
        (the target's sizes and rope, SiLU, no biases or q/k norms), else the target's own."""
        target = self.target_config()
        return llama_layer_config(target) if self.kind in EAGLE3_KINDS and self.head.draft_layer == "llama" else target

    def target_lm_head(self) -> torch.Tensor:
        """[V, H] the target's output-embedding weight (engines without a shared lm_head need a copy)."""
        return self.target_table("lm_head")

    def target_embedding(self) -> torch.Tensor:
        """[V, H] the target's input-embedding table (engines that keep their own copy of it need one)."""
        return self.target_table("embedding")

    def target_table(self, which: str) -> torch.Tensor:
        """[V, H] the target's `which` (TARGET_TABLES): from the loaded model, its GGUF file or its safetensors."""
        module, from_gguf, keys = TARGET_TABLES[which]
        if isinstance(self.target_ref, torch.nn.Module):
            return getattr(self.target_ref, module)().weight.detach().cpu()
        where, extra = self.target_location()
        if "gguf_file" in extra:
            return from_gguf(Path(where) / extra["gguf_file"])
        return read_target_tensor(where, keys, extra.get("revision"), which)

    def target_location(self) -> tuple[str, dict]:
        """Where the target is, resolved as load_target resolves it (the embedded alias included), offline, with the
        revision and trust_remote_code the drafter's recipe loaded it with when it is that target."""
        name = self.target_name()
        if not name:
            raise DraftheadsError("this export needs the target's config but the drafter records no target; pass "
                                  "--target PATH_OR_HUB_ID")
        where, extra = locate_target(name)
        if name != (self.config.get("target") or {}).get("name"):
            return where, extra   # another target (--target): the recorded settings were for the recorded one
        settings, recorded = recorded_settings(self.config), {}
        if settings.get("revision") and not Path(where).exists():
            recorded["revision"] = settings["revision"]
        if settings.get("trust_remote_code"):
            recorded["trust_remote_code"] = True
            if not self.noted:
                print(f"note: reading {name} with trust_remote_code=true, as the drafter's recipe did "
                      f"({self.folder / CONFIG})", file=sys.stderr)
                self.noted = True
        return where, {**extra, **recorded}


def check_fits_target(saved: SavedDrafter) -> None:
    """What loading `saved` for its target checks (check_target, then load_weights' strict shapes), from the target's
    config alone: export runs it before writing tensors no engine could load. With no target config to read there
    is nothing to build against, and a note says so."""
    try:
        config = saved.target_config()
    except DraftheadsError as e:
        print(f"note: {saved.folder} is not checked against its target ({e})", file=sys.stderr)
        return
    check_target(saved.config.get("target"), config, saved.folder, "export it with --target")
    with torch.device("meta"):  # shapes only: a large drafter's weights are never allocated
        module = new_drafter(saved.head, config).files.module
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in saved.state.items()}
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        parts = (([f"missing {missing[:3]}"] if missing else [])
                 + ([f"unexpected {unexpected[:3]}"] if unexpected else []))
        raise DraftheadsError(f"{saved.folder / WEIGHTS} does not match its config.json ({'; '.join(parts)}); "
                              "re-save the drafter")
    wrong = sorted(k for k in expected if expected[k] != found[k])
    if wrong:
        raise DraftheadsError(
            f"{saved.folder / WEIGHTS} does not fit the target {saved.target_name() or ''} ({len(wrong)} tensor(s) of "
            f"other shapes, e.g. {wrong[0]} {list(found[wrong[0]])} where this target needs {list(expected[wrong[0]])})"
            "; export it with the target it was trained for (--target), or retrain it for this one")


# where a checkpoint keeps its input embedding (a tied lm_head is the same table): text models, then multimodal ones
EMBEDDING_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
# SavedDrafter.target_table: table -> (the model's accessor, the GGUF reader, the safetensors keys in order)
TARGET_TABLES = {"lm_head": ("get_output_embeddings", gguf_lm_head, ("lm_head.weight", *EMBEDDING_KEYS)),
                 "embedding": ("get_input_embeddings", gguf_embedding, EMBEDDING_KEYS)}


def read_target_tensor(name: str, keys: tuple[str, ...], revision: str | None = None,
                       what: str = "lm_head") -> torch.Tensor:
    """The first of `keys` found in the target's safetensors files (a local folder, or a hub id in the HF cache)."""
    folder = Path(name) if Path(name).is_dir() else None
    if folder is None:
        try:
            folder = Path(snapshot_download(name, revision=revision, allow_patterns=["*.safetensors", "*.json"],
                                            local_files_only=True))
        except (OSError, ValueError):  # not in the local cache (no download here)
            folder = None
    for file in sorted(folder.glob("*.safetensors")) if folder else ():
        with safe_open(str(file), framework="pt") as f:
            for key in keys:
                if key in f.keys():
                    return f.get_tensor(key)
    raise DraftheadsError(f"cannot read the target's {what} from '{name}' (needed: this engine does not share it); "
                          "pass --target LOCAL_FOLDER")
