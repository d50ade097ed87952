"""Device and dtype choices shared by target loading, training and evaluation, and what a report or a cost profile
records of the machine (`environment`)."""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform
import re
from pathlib import Path

import torch

from draftheads.core.errors import DraftheadsError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True on CPUs with AVX512-BF16 or AMX, where bf16 matmuls run several times faster than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu; other names are checked to exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftheadsError(f"device '{device}' requested but no CUDA GPU is visible; use target.device=cpu "
                              "(--device cpu for eval)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise DraftheadsError("device 'mps' requested but MPS is not available; use target.device=cpu (--device cpu "
                              "for eval)")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype = "auto", device: torch.device | str = "cpu",
                  packed: bool = False) -> torch.dtype:
    """'auto' -> bf16 where the hardware has native bf16 (GPUs, AVX512-BF16/AMX CPUs), else fp32; fp32 for `packed`
    weights (a quantized GGUF target: transformers' GGUF kernels compute in fp32, and in any other dtype every matmul
    casts its input and its output)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto" and packed:
        return torch.float32
    if dtype == "auto":
        kind = torch.device(device).type
        if kind == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if kind == "cpu" and cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise DraftheadsError(f"unknown dtype '{dtype}'; use auto, bf16, fp16 or fp32")
    return DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


def check_cpu_launch(command: str = "train") -> None:
    """`accelerate launch --cpu --num_processes N` starts one process whatever N says; refuse rather than run 1 of N.

    The process cannot see N (accelerate passes it no variable), so this reads the launcher's command line."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("ACCELERATE_USE_CPU", "").lower() != "true":
        return
    try:
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # not Linux: nothing to read
        return
    found = re.search(r"--num[_-]processes[= ](\d+)", " ".join(parent))
    if "accelerate" in " ".join(parent) and found and int(found.group(1)) > 1:
        n = int(found.group(1))
        raise DraftheadsError(f"accelerate launch --cpu starts one process, not {n}; for {n} CPU processes run: "
                              f"torchrun --nproc_per_node {n} -m draftheads.{command} RECIPE")


def environment() -> dict:
    """Library versions and hardware, for report.json."""
    versions = {"python": platform.python_version()}
    for name in ("draftheads", "torch", "transformers", "accelerate", "datasets", "safetensors", "peft"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    hardware = {"platform": platform.platform(), "machine": platform.machine(), "cpu": _cpu_model(),
                "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "cpu_native_bf16": cpu_has_native_bf16(), "cuda": None}
    if torch.cuda.is_available():
        hardware["cuda"] = {"device": torch.cuda.get_device_name(), "count": torch.cuda.device_count(),
                            "cuda_version": torch.version.cuda}
    return {"versions": versions, "hardware": hardware}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
