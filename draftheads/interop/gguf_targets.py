"""Targets as GGUF files for llama.cpp: a GGUF requantized to another type, and a Hugging Face folder converted.

    requantize_gguf(embedded_gguf("smollm2-135m"), Path("targets/q4_0.gguf"), "q4_0")   # an updated target
    convert_to_gguf(Path("targets/full-40"), Path("targets/full-40.gguf"))             # to serve an update

Requantizing reads every tensor of the source (the `gguf` package), dequantizes the quantized ones and quantizes them
again to the new type; tensors in float types and those whose rows do not split into the type's blocks are copied
as they are, as llama.cpp's own quantizer leaves them. Every metadata field is copied, and `general.file_type` set to
the new type. Converting runs the converter kept beside the llama.cpp build (interop/llama_cpp_build.py) in this
Python, with the `gguf` package from the same tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import write_file_atomic
from draftheads.core.writable import check_writable
from draftheads.interop.llama_cpp_build import install_llama_cpp

QUANT_TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
               "q5_0": gguf.GGMLQuantizationType.Q5_0, "q5_1": gguf.GGMLQuantizationType.Q5_1,
               "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPES = {"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
              "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0, "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
FLOAT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
CONVERT_TYPES = ("f32", "f16", "bf16", "q8_0")


def requantize_gguf(source: Path, out: Path, qtype: str) -> Path:
    """`source` with its quantized tensors quantized again to `qtype` (q4_0, q4_1, q5_0, q5_1, q8_0)."""
    if qtype not in QUANT_TYPES:
        raise DraftheadsError(f"cannot requantize to '{qtype}'; choose one of {', '.join(QUANT_TYPES)}")
    check_writable(out, "--out", file=True)  # before every tensor is read and quantized again
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()

    def write(tmp: Path) -> None:
        writer = gguf.GGUFWriter(tmp, arch)
        copy_metadata(reader, writer, {gguf.Keys.General.FILE_TYPE: int(FILE_TYPES[qtype])})
        for tensor in reader.tensors:
            data, raw = requantized(tensor, QUANT_TYPES[qtype])
            writer.add_tensor(tensor.name, data, raw_shape=data.shape if raw is None else None, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return write_file_atomic(out, write)


def requantized(tensor, qtype) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """(data, raw type) to write for one tensor: quantized ones quantized again to qtype, the rest as they are."""
    kind = gguf.GGMLQuantizationType(tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))   # GGUF lists dimensions innermost first
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if kind in FLOAT_TYPES or shape[-1] % block:
        return np.array(tensor.data), kind
    values = gguf.quants.dequantize(tensor.data, kind).reshape(shape).astype(np.float32)
    return gguf.quants.quantize(values, qtype), qtype


def copy_metadata(reader, writer, changed: dict) -> None:
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue   # the writer writes these itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = changed.pop(field.name, field.contents())
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for name, value in changed.items():
        writer.add_uint32(name, value)


def convert_to_gguf(folder: Path, out: Path, outtype: str = "bf16", extra: tuple[str, ...] = ()) -> Path:
    """A Hugging Face folder as one GGUF file, by llama.cpp's converter (outtype f32, f16, bf16 or q8_0; `extra`: more
    of its arguments, e.g. a drafter's --target-model-dir)."""
    if outtype not in CONVERT_TYPES:
        raise DraftheadsError(f"cannot convert to '{outtype}'; choose one of {', '.join(CONVERT_TYPES)}")
    if not (Path(folder) / "config.json").is_file():
        raise DraftheadsError(f"'{folder}' is not a Hugging Face model folder (no config.json)")
    converter = install_llama_cpp().converter

    def write(tmp: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")}
        done = subprocess.run([sys.executable, str(converter), str(folder), "--outfile", str(tmp),
                               "--outtype", outtype, *extra], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise DraftheadsError(f"llama.cpp's converter failed on '{folder}' ({last})")

    return write_file_atomic(out, write)


def gguf_lm_head(path: Path) -> torch.Tensor:
    """[V, H] a GGUF target's output weight, dequantized to fp32: its token embedding where the file has no output
    weight (tied, as Gemma and small Llamas are: llama.cpp then reads the embedding)."""
    return gguf_weight(path, ("output.weight", "token_embd.weight"), "lm_head")


def gguf_embedding(path: Path) -> torch.Tensor:
    """[V, H] a GGUF target's token embedding, dequantized to fp32."""
    return gguf_weight(path, ("token_embd.weight",), "embedding")


def gguf_weight(path: Path, names: tuple[str, ...], what: str) -> torch.Tensor:
    """The first of `names` in a GGUF file, dequantized to fp32 in PyTorch's dimension order."""
    try:
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    except Exception as e:  # noqa: BLE001 - a damaged file: the gguf package raises several types
        raise DraftheadsError(f"cannot read the target's {what} from {path} ({type(e).__name__}); check the "
                              "file, or pass --target with the target's Hugging Face folder") from None
    tensor = next((tensors[name] for name in names if name in tensors), None)
    if tensor is None:
        raise DraftheadsError(f"{path} holds no {' or '.join(names)}; pass --target with the target's Hugging Face "
                              "folder")
    shape = tuple(int(n) for n in reversed(tensor.shape))   # GGUF lists dimensions innermost first
    values = gguf.quants.dequantize(tensor.data, gguf.GGMLQuantizationType(tensor.tensor_type))
    return torch.from_numpy(np.ascontiguousarray(values.reshape(shape), dtype=np.float32))
