"""The MTP layers a checkpoint ships (heads/native_mtp.py): read into a drafter, and put back into a copy.

    drafter = shipped_drafter(target)                       # the as-shipped drafter, bound to `target`
    export_drafter(run, "checkpoint", out)                  # a new checkpoint folder with the fine-tuned MTP layers

Reading maps each of our tensors to its key in the checkpoint (its safetensors index or single file), stacking
per-expert MoE weights (mlp.experts.{e}.gate_proj/up_proj/down_proj) into transformers' fused gate_up_proj /
down_proj as transformers' own qwen2_moe conversion does, and reads only those tensors. Putting back writes the
same keys, in the dtype and expert layout the checkpoint had, into a new folder: files that hold no drafter tensor are
hard links to the original's (copies across file systems), the shards that do are rewritten whole (their other
tensors byte for byte), and the index is written anew. The original is never opened for writing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import link_or_copy
from draftheads.core.writable import check_writable
from draftheads.core.target_dims import text_config
from draftheads.data.target import load_target
from draftheads.heads.factory import bound_drafter, head_config
from draftheads.heads.native_mtp import merged_state, shipped_layout
from draftheads.interop.assistant_folder import shipped_assistant
from draftheads.interop.layout import VLLM, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter, save_drafter

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
TRANSFORMERS = "huggingface/transformers"
# our name of each fusion part -> its name in the layout (the decoder layer's own names are kept)
PARTS = {"nextn": {"enorm": "enorm", "hnorm": "hnorm", "proj": "eh_proj", "out_norm": "shared_head.norm"},
         "qwen": {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "proj": "fc", "out_norm": "norm"},
         "mimo": {"enorm": "enorm", "hnorm": "hnorm", "proj": "eh_proj", "out_norm": "final_layernorm"}}
# the decoder layer's names where a checkpoint's differ from transformers' module (MiMo-V2's MTP layer, vLLM's names)
LAYER_NAMES = {"mimo": {"post_attention_layernorm.": "pre_mlp_layernorm.",
                        "self_attn.sinks": "self_attn.attention_sink_bias"}}
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")

LAYOUTS = (
    Layout(
        format="checkpoint", kind="native", engine="the target's own loaders (vLLM DeepSeekMTP / Glm4MoeMTP / "
                                                   "Qwen3NextMTP / Qwen3_5MTP, SGLang NextN, llama.cpp draft-mtp)",
        weights_file="the checkpoint's own shards", architectures=None,
        config={"(all)": "the target's config.json, unchanged: num_nextn_predict_layers / mtp_num_hidden_layers"},
        tensors=(
            Tensor("model.layers.{k}.enorm.weight", ("H",)), Tensor("model.layers.{k}.hnorm.weight", ("H",)),
            Tensor("model.layers.{k}.eh_proj.weight", ("H", "2H")),   # [enorm(emb); hnorm(h)]: embedding first
            Tensor("model.layers.{k}.shared_head.norm.weight", ("H",)),
            Tensor("mtp.pre_fc_norm_embedding.weight", ("H",)), Tensor("mtp.pre_fc_norm_hidden.weight", ("H",)),
            Tensor("mtp.fc.weight", ("H", "2H")), Tensor("mtp.norm.weight", ("H",)),
        ),
        families=("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                  "qwen3_5_moe_text", "mimo_v2_flash"),
        read_from=(LoaderFile(VLLM, "vllm/model_executor/models/deepseek_mtp.py",
                              "03356f8cb59ba27f3d0ce8866d7516b5e32cff65"),
                   LoaderFile(VLLM, "vllm/model_executor/models/qwen3_next_mtp.py",
                              "055e47c28003156421365af985d676fc921cb075"),
                   LoaderFile(VLLM, "vllm/model_executor/models/mimo_v2_mtp.py",
                              "037951aa733b6aa8ef8d103040ea810f07e27137"),
                   LoaderFile(TRANSFORMERS, "src/transformers/modeling_layers.py (MtpLayer, MtpModel)", "5.24.0")),
        traps=(
            "NextN modules sit at model.layers.{num_hidden_layers + k} beside the decoder layer's own keys; their "
            "shared_head.head and embed_tokens are copies of the target's, left as they are",
            "vLLM carries a NextN module's output to the next step before shared_head.norm, Qwen's after mtp.norm "
            "(transformers' MtpModel and ATOM carry NextN's after it too: head.normed_carry picks)",
            "vLLM zeroes the DeepSeek MTP input embedding at position 0",
            "MiMo-V2 ships 3 MTP layers at model.mtp.layers.{0,1,2} (pre_mlp_layernorm, final_layernorm, "
            "attention_sink_bias); vLLM runs the first for every step, and so does head.type native",
            "per-expert keys in the checkpoint, fused [E, 2I, H] / [E, H, I] tensors in transformers' layer",
        ),
    ),
)


def refusal(saved: SavedDrafter) -> str | None:
    return None


def checkpoint_folder(name: str, revision: str | None = None) -> Path:
    """The folder of checkpoint `name`: a local folder, or a hub id already in the local cache (loading the target
    put it there; nothing is downloaded here)."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=["*.safetensors", "*.json"],
                                      local_files_only=True))
    except (OSError, ValueError):
        raise DraftheadsError(f"cannot find the checkpoint '{name}' locally to read its MTP layers; pass a local "
                              "folder (head.checkpoint)") from None


def key_files(folder: Path) -> dict[str, str]:
    """Every tensor key of the checkpoint in `folder` -> the file holding it."""
    if (folder / INDEX).is_file():
        try:
            return dict(json.loads((folder / INDEX).read_text())["weight_map"])
        except (ValueError, KeyError, TypeError):
            raise DraftheadsError(f"{folder / INDEX} is damaged (no readable weight_map); restore it from the "
                                  "checkpoint's source") from None
    if (folder / SINGLE).is_file():
        with safe_open(str(folder / SINGLE), framework="pt") as f:
            return {key: SINGLE for key in f.keys()}
    raise DraftheadsError(f"{folder} holds neither {INDEX} nor {SINGLE}; give the folder of a safetensors checkpoint")


def native_keys(our_keys, target_config, available: dict[str, str]) -> dict[str, list[str]]:
    """Each of our drafter tensors -> the checkpoint keys it is made of: one key, or, for fused experts held per
    expert in the checkpoint, [gate_0, up_0, gate_1, ...] (gate_up_proj) or [down_0, down_1, ...] (down_proj)."""
    layout = shipped_layout(target_config)
    first = text_config(target_config).num_hidden_layers
    out = {}
    for key in our_keys:
        _, module, part, rest = key.split(".", 3) if key.startswith("blocks.") else (None, None, None, None)
        if module is None:
            raise DraftheadsError(f"unexpected tensor {key} in a native MTP drafter; re-save the drafter")
        prefix = {"nextn": f"model.layers.{first + int(module)}.", "qwen": "mtp.",
                  "mimo": f"model.mtp.layers.{module}."}[layout]
        if part != "layer":
            out[key] = [f"{prefix}{PARTS[layout][part]}.{rest}"]
            continue
        layer = f"{prefix}layers.{module}." if layout == "qwen" else prefix
        for ours, theirs in LAYER_NAMES.get(layout, {}).items():
            rest = rest.replace(ours, theirs)
        out[key] = expert_keys(layer, rest, available) or [layer + rest]
    return out


def expert_keys(layer: str, name: str, available: dict[str, str]) -> list[str] | None:
    """The per-expert keys a fused expert tensor is stacked from, when the checkpoint holds them so."""
    if name not in EXPERTS or f"{layer}{name}" in available:
        return None
    base = name.rsplit(".", 1)[0]   # mlp.experts
    count = sum(1 for k in available if k.startswith(f"{layer}{base}.") and k.endswith(".down_proj.weight"))
    if name.endswith("gate_up_proj"):
        return [f"{layer}{base}.{e}.{which}.weight" for e in range(count) for which in ("gate_proj", "up_proj")]
    return [f"{layer}{base}.{e}.down_proj.weight" for e in range(count)]


# ---- reading ------------------------------------------------------------------------------------------------------


def shipped_drafter(target, config=None):
    """The drafter `target`'s checkpoint ships (head config `config`, default head.type native's defaults), bound to
    `target` and on its device and dtype."""
    config = config or head_config({"type": "native"})
    drafter = bound_drafter(config, target)
    name = config.checkpoint or getattr(target, "name_or_path", None) or target.config._name_or_path
    read_shipped(drafter, checkpoint_folder(name, getattr(target.config, "_commit_hash", None)), target.config)
    return drafter


def read_shipped(drafter, folder: Path, target_config) -> None:
    """Load the MTP tensors of the checkpoint in `folder` into `drafter` (strictly: every tensor it has)."""
    available = key_files(folder)
    ours = drafter.state_dict()
    # with LoRA (train_only: lora) the layer's weights sit under peft's base_layer; the adapters start as peft made
    # them (B = 0: the shipped layer's output)
    adapters = {k: v for k, v in ours.items() if ".lora_A." in k or ".lora_B." in k}
    plain = {k.replace(".base_layer.", "."): k for k in ours if k not in adapters}
    wanted = native_keys(plain, target_config, available)
    missing = [k for keys in wanted.values() for k in keys if k not in available]
    if missing:
        raise DraftheadsError(f"{folder} holds no {missing[0]} ({len(missing)} of the MTP tensors a "
                              f"{text_config(target_config).model_type} checkpoint ships are missing); this "
                              "checkpoint ships no MTP layers or they were stripped: use the original release")
    tensors = read_keys(folder, available, {k for keys in wanted.values() for k in keys})
    quantized = next((k for k, v in tensors.items() if v.dtype.itemsize == 1), None)
    if quantized:
        raise DraftheadsError(f"{folder} stores its MTP tensors quantized ({quantized} is {tensors[quantized].dtype}); "
                              "dequantize the checkpoint to bf16 first (as its model card describes)")
    state = {plain[key]: assemble(key, [tensors[k] for k in keys], ours[plain[key]]) for key, keys in wanted.items()}
    drafter.load_state_dict({**state, **adapters}, strict=True)


def read_keys(folder: Path, available: dict[str, str], keys: set[str]) -> dict[str, torch.Tensor]:
    """Just `keys`, file by file."""
    out = {}
    for file in sorted({available[k] for k in keys}):
        with safe_open(str(folder / file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in keys if available[k] == file})
    return out


def assemble(key: str, parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """One of our tensors from its checkpoint parts, in `like`'s dtype; a shape that does not fit is one line."""
    if len(parts) == 1:
        tensor = parts[0]
    elif key.endswith("gate_up_proj"):   # [E, 2I, H]: each expert's gate rows, then its up rows
        tensor = torch.stack([torch.cat(parts[i : i + 2], dim=0) for i in range(0, len(parts), 2)])
    else:
        tensor = torch.stack(parts)
    if tuple(tensor.shape) != tuple(like.shape):
        raise DraftheadsError(f"the checkpoint's MTP tensor for {key} is {list(tensor.shape)}, where this target's "
                              f"config builds {list(like.shape)}; the config.json does not match the weights")
    return tensor.to(like.dtype)


def split_back(key: str, tensor: torch.Tensor, count: int) -> list[torch.Tensor]:
    """assemble's inverse: the checkpoint parts of one of our tensors."""
    if count == 1:
        return [tensor]
    if key.endswith("gate_up_proj"):
        return [half for expert in tensor for half in expert.chunk(2, dim=0)]
    return list(tensor.unbind(0))


# ---- putting back -------------------------------------------------------------------------------------------------


def write_checkpoint(saved: SavedDrafter, tmp: Path) -> dict:
    """Fill `tmp` with a copy of the drafter's checkpoint whose MTP tensors are the drafter's; returns what was
    written (for the export record)."""
    source = source_folder(saved)
    available = key_files(source)
    state = merged_state(saved.state, saved.head)   # LoRA adapters folded into the weights they adapt
    wanted = native_keys(state, AutoConfig.from_pretrained(source), available)
    missing = [k for keys in wanted.values() for k in keys if k not in available]
    if missing:
        raise DraftheadsError(f"{source} holds no {missing[0]}: it is not the checkpoint this drafter was read from; "
                              "pass --target with that checkpoint's folder")
    replacements = {k: part for key, keys in wanted.items()
                    for k, part in zip(keys, split_back(key, state[key], len(keys)))}
    rewritten = sorted({available[k] for k in replacements})
    for entry in sorted(source.iterdir()):
        if entry.name in rewritten:
            mine = {k: v for k, v in replacements.items() if available[k] == entry.name}
            rewrite_shard(entry, tmp / entry.name, mine)
        elif entry.name == INDEX:   # the same map (every key stays in its shard), written as a file of its own
            (tmp / INDEX).write_text(json.dumps(json.loads(entry.read_text()), indent=2) + "\n")
        elif entry.is_dir():
            shutil.copytree(entry, tmp / entry.name, copy_function=link_or_copy)
        else:
            link_or_copy(entry, tmp / entry.name)
    size = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
    return {"checkpoint": str(source), "rewritten_files": rewritten, "tensors_written": len(replacements),
            "bytes_rewritten": sum((tmp / f).stat().st_size for f in rewritten), "checkpoint_bytes": size}


def source_folder(saved: SavedDrafter) -> Path:
    """The checkpoint the drafter's MTP layers were read from: head.checkpoint, else its target."""
    name = saved.head.checkpoint or saved.target_name()
    if not name:
        raise DraftheadsError("this drafter records no checkpoint to put its MTP layers back into; pass --target with "
                              "the checkpoint's folder")
    return checkpoint_folder(name, (saved.config.get("target") or {}).get("revision"))


def rewrite_shard(src: Path, dst: Path, replacements: dict[str, torch.Tensor]) -> None:
    """`src`'s tensors with `replacements` (cast to the dtype each had), written to `dst` with `src`'s metadata."""
    with safe_open(str(src), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(src))
    for key, tensor in replacements.items():
        old = tensors[key]
        if tuple(old.shape) != tuple(tensor.shape):
            raise DraftheadsError(f"the drafter's {key} is {list(tensor.shape)} but {src} holds {list(old.shape)}; "
                                  "put it back into the checkpoint it was read from")
        tensors[key] = tensor.to(old.dtype).contiguous()
    save_file(tensors, str(dst), metadata=metadata)


WRITERS = {"native": write_checkpoint}   # fills the export folder (interop/export.py: FOLDER_FORMATS)


def save_shipped(target_spec: str, out, depth: int = 3, dtype: str = "auto", assistant: str | None = None) -> Path:
    """The drafter the target's checkpoint ships (or, with `assistant`, the Gemma 4 assistant folder shipped beside
    it), written as a draftheads drafter folder at `out`: what `draftheads eval` measures as the baseline, and what
    head.init_from starts a fine-tune from."""
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DraftheadsError(f"--out {out} exists and is not an empty folder; choose a new one")
    check_writable(out, "--out", published=True)
    target, _ = load_target(target_spec, dtype=dtype, device="cpu")
    if assistant:
        drafter = shipped_assistant(target, head_config({"type": "assistant", "source": assistant, "depth": depth}))
    else:
        drafter = shipped_drafter(target, head_config({"type": "native", "depth": depth}))
    return save_drafter(drafter, out, target=target)
