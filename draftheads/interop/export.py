"""Export a native drafter to the folder a serving engine loads.

native drafter folder (or run folder) -> checks (head kind x format x target family) -> the
engine module's writer (tensors renamed, the engine's config.json) -> OUT, written atomically. A
folder an engine would mis-load silently is never written: such combinations are a one-line error
that lists the formats this drafter supports. `draftheads_export.json` records where it came from,
and README.md is its model card (interop/model_card.py: the serve command, the tau an eval measured).
With `push_to_hub`, the folder is then uploaded (interop/hub_upload.py).

Export never removes what it did not write: OUT must be new, empty, or (with `overwrite`) a
previous export of the same format; a run folder, a data folder, or a folder holding the drafter
being exported is refused whatever the flags.

Each engine is one module of this package (its layouts, traps, writers and readers); adding an
engine format means adding its module and listing it in `ENGINES`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from draftheads.core.config import suggest, to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import write_folder
from draftheads.core.run_folder import BEST, DATA_MARKER, DRAFTER, FINAL, incomplete_checkpoints, list_checkpoints
from draftheads.core.writable import check_writable
from draftheads.interop import (assistant_folder, deepseek_mtp, deepspec, llama_cpp_block, sglang, shipped_mtp,
                                speculators, tgi, vllm)
from draftheads.interop.dflash_layout import logit_change
from draftheads.interop.export_config import ExportConfig
from draftheads.interop.hub_upload import check_can_push, push_folder
from draftheads.interop.layout import LABELS, Layout
from draftheads.interop.model_card import find_measured, front_matter, target_licence, write_card
from draftheads.interop.native import (CONFIG, EAGLE3_KINDS, PROVENANCE, WEIGHTS, SavedDrafter, check_fits_target,
                                      read_export_record)
from draftheads.interop.vocab_mapping import write_vocab_mappings

ENGINES = {"vllm": vllm, "sglang": sglang, "tgi": tgi, "speculators": speculators, "deepseek-mtp": deepseek_mtp,
           "deepspec": deepspec, "llama.cpp": llama_cpp_block, "checkpoint": shipped_mtp, "assistant": assistant_folder}
# formats that are not a safetensors file and a config.json: their WRITERS fill the folder themselves
FOLDER_FORMATS = ("llama.cpp", "checkpoint", "assistant")
# formats that are the shipped model's own folder, written with its own files (its model card kept)
SHIPPED_FORMATS = ("checkpoint", "assistant")
# the weights' dtype when --dtype is not given: as saved (fp32 master weights), except where the engine's own
# converter defaults to half precision
DEFAULT_DTYPES = {"llama.cpp": "fp16"}
FORMATS = ("native", *ENGINES)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def export_drafter(src, fmt: str, out, target=None, overwrite: bool = False, dtype: str | None = None,
                   speculative_tokens: int | None = None, target_gguf=None, eval_report: str | None = None,
                   push_to_hub: str | None = None, private: bool = False) -> Path:
    """Write the drafter at `src` (drafter or run folder) as `fmt` into folder `out`.

    `target` (a loaded model, a local path or a hub id) is needed only when the drafter's own
    record of its target cannot be resolved. `overwrite` lets a previous export of the same format
    in `out` be replaced. `dtype` (bf16, fp16, fp32) casts the floating-point tensors (default: as saved, the fp32
    master weights). `speculative_tokens`: the draft length written where an engine config takes one (default: the
    length the drafter was trained for). `target_gguf`: llama.cpp only, the target GGUF the drafter runs with (default:
    `target` when it is a .gguf file, else the drafter's recorded target: a .gguf file or the embedded one).
    `eval_report`: the eval report the model card cites (default: the newest in the drafter's run folder that measured
    it). `push_to_hub`: a hub repository (OWNER/NAME) the folder is then uploaded to, created `private` if new.
    Returns `out`.
    """
    if fmt not in FORMATS:
        raise DraftheadsError(f"unknown export format '{fmt}'{suggest(fmt, FORMATS)}; use one of {', '.join(FORMATS)}")
    if dtype is not None and dtype not in DTYPES:
        raise DraftheadsError(f"unknown export dtype '{dtype}'; use one of {', '.join(DTYPES)}")
    ExportConfig(speculative_tokens=speculative_tokens, eval_report=eval_report, push_to_hub=push_to_hub,
                 private=private)   # checked as the flags are
    if push_to_hub:
        check_can_push(push_to_hub)   # before any work
    dtype = dtype or DEFAULT_DTYPES.get(fmt)
    saved = SavedDrafter.read(src, target, dtype=DTYPES.get(dtype), speculative_tokens=speculative_tokens)
    out = Path(out).expanduser()
    check_out(out, fmt, saved, overwrite)
    if fmt != "native":
        check_allowed(saved, fmt)
    check_fits_target(saved)  # what eval checks when it loads the drafter: no folder an engine cannot load
    measured = find_measured(saved, eval_report)
    folder = write_export(saved, fmt, out, dtype, target, target_gguf, measured, push_to_hub)
    if push_to_hub:
        url = push_folder(folder, push_to_hub, private, f"draftheads export: {LABELS[saved.kind]} drafter for "
                                                        f"{saved.target_name() or 'its target'} ({fmt})")
        print(f"draftheads export: uploaded {folder} to {url}", flush=True)
    return folder


def write_export(saved: SavedDrafter, fmt: str, out: Path, dtype: str | None, target, target_gguf, measured,
                 repo: str | None) -> Path:
    """The export folder, written atomically: the engine's files, the export record and the model card."""
    provenance = {"format": fmt, "source": str(saved.folder), "head": to_dict(saved.head),
                  "target": saved.config.get("target"), "feature_layers": saved.config.get("feature_layers")}
    if fmt == "native":

        def copy(tmp: Path) -> None:
            shutil.copytree(saved.folder, tmp, dirs_exist_ok=True)
            if dtype is not None:   # the same tensors, cast
                save_file({k: v.contiguous() for k, v in saved.state.items()}, str(tmp / WEIGHTS),
                          metadata={"format": "pt"})
            write_mappings(tmp, saved)
            (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
            write_card(tmp, saved, fmt, provenance, measured, out, repo)

        return write_folder(out, copy)
    if fmt in SHIPPED_FORMATS:   # the shipped folder with the drafter's weights: its own model card is kept

        def fill_checkpoint(tmp: Path) -> None:
            record = {**provenance, **ENGINES[fmt].WRITERS[saved.kind](saved, tmp)}
            (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")

        return write_folder(out, fill_checkpoint)
    if fmt in FOLDER_FORMATS:

        def fill_engine_folder(tmp: Path) -> None:
            gguf = target_gguf or (target if isinstance(target, (str, os.PathLike)) and str(target).endswith(".gguf")
                                   else None)
            source = ENGINES[fmt].target_gguf(saved, gguf)
            # the card's front matter (base model, licence, tags) also goes into the GGUF, as llama.cpp's converter
            # puts a model folder's README.md there
            metadata = front_matter(saved, fmt, target_licence(saved, online=repo is not None, gguf=source)[0])
            record = {**provenance, **ENGINES[fmt].WRITERS[saved.kind](saved, tmp, source, metadata)}
            (tmp / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
            write_card(tmp, saved, fmt, record, measured, out, repo)

        return write_folder(out, fill_engine_folder)
    tensors, config, weights_file = ENGINES[fmt].WRITERS[saved.kind](saved)

    def fill(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / weights_file), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        write_mappings(tmp, saved)
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        write_card(tmp, saved, fmt, provenance, measured, out, repo)

    return write_folder(out, fill)


def write_mappings(folder: Path, saved: SavedDrafter) -> None:
    """An EAGLE-3 drafter's draft vocabulary also as SpecForge's vocab_mapping.pt and speculators' d2t.npy / t2d.npy,
    for reuse there (and here: train.draft_vocab_from)."""
    if saved.kind in EAGLE3_KINDS and "d2t" in saved.state:
        write_vocab_mappings(folder, saved.state["d2t"], int(saved.config["target"]["vocab_size"]))


def check_out(out: Path, fmt: str, saved: SavedDrafter, overwrite: bool) -> None:
    """Refuse an --out that export would have to destroy something to write, before any work is done."""
    source = saved.folder.resolve()
    where = out.resolve()
    if where == source or source.is_relative_to(where) or where.is_relative_to(source):
        raise DraftheadsError(f"--out {out} is, holds or lies inside the drafter being exported ({saved.folder}); "
                              "choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise DraftheadsError(f"--out {out} is a file; give a folder (new or empty)")
    if out.is_dir() and holds_training_work(out):
        raise DraftheadsError(f"--out {out} holds training checkpoints, drafters or data (a run or data folder); "
                              "export into a new folder")
    if out.is_dir() and any(out.iterdir()):
        previous = previous_export(out)
        if previous is None:
            raise DraftheadsError(f"--out {out} is not empty and is not a draftheads export; choose a new or "
                                  "empty folder")
        if previous != fmt:
            raise DraftheadsError(f"--out {out} holds a previous '{previous}' export, not '{fmt}'; choose "
                                  "another folder")
        if not overwrite:
            raise DraftheadsError(f"--out {out} holds a previous '{fmt}' export; pass --overwrite to replace it")
    check_writable(out, "--out", published=True)  # built beside it and renamed in (core/folders.py)


def holds_training_work(folder: Path) -> bool:
    """A run folder (checkpoints, final/ or best/ drafters), a `draftheads data` folder or any saved dataset."""
    return bool(list_checkpoints(folder) or incomplete_checkpoints(folder) or (folder / FINAL / DRAFTER).exists()
                or (folder / BEST / DRAFTER).exists() or (folder / DATA_MARKER).exists()
                or (folder / "dataset_info.json").exists() or (folder / "dataset_dict.json").exists())


def previous_export(folder: Path) -> str | None:
    """The format of the draftheads export in `folder`, None if it holds none; a damaged record is refused, not
    written over (--overwrite would replace a folder nothing says is an export)."""
    if not (folder / PROVENANCE).is_file():
        return None
    return read_export_record(folder).get("format")


# ---- which formats a drafter may go to --------------------------------------------------------


def find_layout(fmt: str, kind: str) -> Layout | None:
    return next((layout for layout in ENGINES[fmt].LAYOUTS if layout.kind == kind), None)


def refusal(saved: SavedDrafter, fmt: str) -> str | None:
    """Why `saved` cannot be exported as `fmt` (None: it can)."""
    kind = saved.kind
    # EAGLE-3 engines build the drafter's layer class
    family = saved.layer_family if kind in EAGLE3_KINDS else saved.family
    if fmt == "native":
        return None
    if kind == "peagle" and saved.head.markov_rank:
        return ("no engine runs a Markov head on P-EAGLE's slots (head.markov_rank > 0), and without it the slots "
                "draft otherwise than trained; serve it in draftheads' loop, or train with head.markov_rank: 0")
    if kind == "medusa2":
        return ("Medusa-2 heads read the LoRA-adapted target, which engines do not build; merge the adapter into the "
                "target first")
    layout = find_layout(fmt, kind)
    if layout is None:
        loads = sorted({LABELS[other.kind] for other in ENGINES[fmt].LAYOUTS if other.kind in LABELS})
        return f"{fmt} has no loader for {LABELS[kind]} drafters (it loads {', '.join(loads)} drafters only)"
    if layout.families and family not in layout.families:
        if kind in EAGLE3_KINDS:
            return (f"{layout.engine} has no EAGLE-3 class for a {family} draft layer (it builds "
                    f"{', '.join(layout.families)} layers); train with head.draft_layer: llama, which every "
                    "engine loads")
        return (f"{layout.engine} has no {kind} layer for a {family or 'unknown'} target (it supports "
                f"{', '.join(layout.families)})")
    if layout.targets and saved.family not in layout.targets:
        # the engine fails at start-up: its model class for this target hands out no hidden states at chosen layers
        return (f"{layout.engine} reads the target's hidden states at chosen layers, which its model class for a "
                f"{saved.family or 'unknown'} target does not give (it gives them for {', '.join(layout.targets)})")
    change = logit_change(saved) if kind == "dspark" and saved.head.markov_rank else None
    if change:
        # every engine with a DSpark layout adds the bias to raw logits (dflash_layout.logit_change)
        return (f"{layout.engine} adds DSpark's Markov bias to lm_head's logits as they are, and this "
                f"{saved.family} target transforms its logits first ({change}), as this drafter was trained; "
                "serve it in draftheads' loop (native), or train it with head.markov_rank: 0 and "
                "head.confidence_with_markov: false")
    reason = ENGINES[fmt].refusal(saved)  # what this engine's loader cannot hold
    if reason is None and kind not in ENGINES[fmt].WRITERS:
        return f"writing {kind} heads for {layout.engine} is not implemented"
    return reason


def allowed_formats(saved: SavedDrafter) -> list[str]:
    return [fmt for fmt in FORMATS if refusal(saved, fmt) is None]


def check_allowed(saved: SavedDrafter, fmt: str) -> None:
    reason = refusal(saved, fmt)
    if reason:
        raise DraftheadsError(f"cannot export this {LABELS[saved.kind]} drafter as '{fmt}': {reason}; "
                              f"formats for it: {', '.join(allowed_formats(saved))}")
