"""llama.cpp: DSpark and DFlash drafters as GGUF files of architecture `dflash`, made by llama.cpp's own converter.

    draftheads export runs/dspark-smollm2 --format llama.cpp --out exported/
    llama-server -m exported/SmolLM2-135M-Instruct.Q4_1.gguf -md exported/drafter.gguf --spec-type draft-dspark

Unlike EAGLE-3 (interop/llama_cpp.py writes that GGUF itself), these go through the converter kept beside the llama.cpp
build (`convert_hf_to_gguf.py`, conversion/qwen.py: DFlashModel, DSparkModel): it reads our speculators folder
(`DSparkSpeculator` / `DFlashSpeculator`, interop/speculators.py), and with `--target-model-dir` the target's
tokenizer and config. The speculators schema is the one the converter reads our slot convention from: DSpark with
`sample_from_anchor` true (every slot drafts), DFlash with it false (the pending token and B - 1 drafts, z-lab's).
The converter registers no `DFlashSpeculator`, and its z-lab class (DFlashModel) reads no draft vocabulary; its DSpark
class reads both the schema and d2t, so a DFlash drafter goes to it as a DSpark folder without Markov and confidence
heads (markov_rank 0), which is what DFlash is to it: the same `dflash` GGUF architecture.
The target folder is the Hugging Face folder the drafter was trained on (the embedded target's cached checkpoint, with
the tokenizer it was converted with); the converted drafter's vocabulary is then checked token for token against the
target GGUF it will run with, as llama-server pairs them only then.

This module is what the exporter knows as llama.cpp (interop/export.py: ENGINES): its LAYOUTS and WRITERS are
EAGLE-3's (interop/llama_cpp.py) and these two; the target GGUF and the refusals are llama_cpp.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGUFReader
from safetensors.torch import save_file

from draftheads.core.errors import DraftheadsError
from draftheads.core.targets import ALIASES, embedded_checkpoint
from draftheads.interop import speculators
from draftheads.interop.gguf_targets import convert_to_gguf
from draftheads.interop.layout import Layout, LoaderFile
from draftheads.interop import llama_cpp
from draftheads.interop.llama_cpp import (DRAFTER_FILE, LLAMA_CPP, VENDORED, check_target_gguf, link_or_copy, refusal,
                                          target_gguf)
from draftheads.interop.native import SavedDrafter

SPEC_TYPES = {"dspark": "draft-dspark", "dflash": "draft-dflash"}
SOURCE_FOLDER = "speculators"   # the converter's input, kept in the export folder (what the GGUF was made from)

READ_FROM = (
    LoaderFile(LLAMA_CPP, "conversion/qwen.py", VENDORED),
    LoaderFile(LLAMA_CPP, "convert_hf_to_gguf.py", VENDORED),
    LoaderFile(LLAMA_CPP, "docs/speculative.md", VENDORED),
)
TRAPS = (
    "the converter reads the slot convention from sample_from_anchor (speculators schema): true drafts from every "
    "slot, false from the mask slots only",
    "--target-model-dir supplies the vocabulary: it must be the tokenizer of the GGUF the drafter runs with",
    "--spec-draft-n-max is clamped to the drafter's block size",
)

LAYOUTS = llama_cpp.LAYOUTS + tuple(
    Layout(
        format="llama.cpp", kind=kind, engine=f"llama.cpp ({spec})", weights_file=DRAFTER_FILE, architectures=None,
        config={"general.architecture": "dflash", "dflash.block_size": "B", "dflash.target_layers": "ids + 1",
                "dflash.sample_from_anchor": "true (DSpark) / false (DFlash)",
                "tokenizer.*": "the target folder's, equal to the target GGUF's"},
        tensors=(), families=(), read_from=READ_FROM, traps=TRAPS)
    for kind, spec in SPEC_TYPES.items()
)


def target_folder(saved: SavedDrafter) -> Path:
    """The Hugging Face folder of the drafter's target (config.json and tokenizer), which the converter reads."""
    name = saved.target_name()
    if name in ALIASES:
        return embedded_checkpoint(name)
    if name and (Path(name).expanduser() / "config.json").is_file():
        return Path(name).expanduser()
    raise DraftheadsError(f"llama.cpp's converter needs the target's Hugging Face folder (its tokenizer) and "
                          f"'{name}' is not one on this machine; download the target and export with --target PATH")


def fill_block_export(saved: SavedDrafter, folder: Path, source: Path, card: dict | None = None) -> dict:
    """The drafter GGUF, converted by llama.cpp from our speculators folder, and the target GGUF `source`, in
    `folder`; returns what the provenance file records."""
    reader = check_target_gguf(saved, source)
    hf = folder / SOURCE_FOLDER
    hf.mkdir()
    tensors, config, weights = speculators.WRITERS[saved.kind](saved)
    if saved.kind == "dflash":
        config = {**config, "architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
                  "markov_rank": 0, "enable_confidence_head": False, "confidence_head_with_markov": False}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(hf / weights), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    convert_to_gguf(hf, folder / DRAFTER_FILE, outtype="f32" if str(saved.dtype) == "torch.float32" else "bf16",
                    extra=("--target-model-dir", str(target_folder(saved))))
    check_same_vocabulary(folder / DRAFTER_FILE, reader)
    link_or_copy(source, folder / source.name)
    n = saved.head.block_size if saved.kind == "dspark" else saved.head.block_size - 1
    command = (f"llama-server -m {source.name} -md {DRAFTER_FILE} --spec-type {SPEC_TYPES[saved.kind]} "
               f"--spec-draft-n-max {n}")
    return {"llama_cpp": {"drafter": DRAFTER_FILE, "target": source.name, "target_source": str(source),
                          "draft_tokens": n, "spec_type": SPEC_TYPES[saved.kind], "command": command}}


def check_same_vocabulary(drafter: Path, target_reader) -> None:
    """llama-server pairs a drafter with its target only when their vocabularies agree token for token."""
    ours = GGUFReader(str(drafter)).fields.get("tokenizer.ggml.tokens")
    theirs = target_reader.fields.get("tokenizer.ggml.tokens")
    if ours is None or theirs is None or list(ours.contents()) != list(theirs.contents()):
        raise DraftheadsError("the converted drafter's vocabulary differs from the target GGUF's, which llama-server "
                              "refuses; export with the target folder the GGUF was converted from (--target PATH)")


WRITERS = {**llama_cpp.WRITERS, **{kind: fill_block_export for kind in SPEC_TYPES}}
__all__ = ["LAYOUTS", "WRITERS", "refusal", "target_gguf", "fill_block_export"]
