"""Export a native drafter to the folder a serving engine loads (layouts: heads/engine_formats.py).

native drafter folder (or run folder) -> checks (head type x format x target family) -> tensors
renamed (heads/engine_maps.py) + the engine's config.json -> OUT, written atomically. A folder an
engine would mis-load silently is never written: such combinations are a one-line error that
lists the formats this drafter supports. `draftheads_export.json` records where it came from.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftheads.config import build
from draftheads.errors import DraftheadsError
from draftheads.heads import draft_vocab
from draftheads.heads import engine_maps as maps
from draftheads.heads.common import text_config
from draftheads.heads.native import CONFIG, FORMAT, WEIGHTS, resolve_drafter_folder

FORMATS = ("native", "vllm", "sglang", "tgi", "speculators", "deepseek-mtp")
PROVENANCE = "draftheads_export.json"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config schema we write


@dataclass
class Source:
    """A native drafter read from disk, plus its target's config when the export needs it."""

    folder: Path
    config: dict  # the native config.json
    state: dict[str, torch.Tensor]
    target_ref: object  # a loaded model, a path / hub id, or None (use the recorded target name)

    @property
    def head(self) -> dict:
        return self.config["head"]

    @property
    def kind(self) -> str:
        return "eagle3" if self.head["type"] == "eagle" and self.head.get("eagle3") else self.head["type"]

    @property
    def family(self) -> str | None:
        return (self.config.get("target") or {}).get("model_type")

    @property
    def dtype(self) -> torch.dtype:
        return next(t.dtype for t in self.state.values() if t.is_floating_point())

    def target_name(self) -> str | None:
        if isinstance(self.target_ref, (str, os.PathLike)):
            return str(self.target_ref)
        return (self.config.get("target") or {}).get("name") or getattr(getattr(self.target_ref, "config", None), "_name_or_path", None) or None

    def target_config(self):
        """The target's full config (layer sizes, rope, norms) for the engine's config.json."""
        if self.target_ref is not None and hasattr(self.target_ref, "config"):
            return text_config(self.target_ref.config)
        name = self.target_name()
        if not name:
            raise DraftheadsError("this export needs the target's config but the drafter records no target; pass --target PATH_OR_HUB_ID")
        from transformers import AutoConfig

        try:
            return text_config(AutoConfig.from_pretrained(name))
        except (OSError, ValueError) as e:
            raise DraftheadsError(f"cannot read the target config from '{name}' ({str(e).splitlines()[0][:120]}); pass --target PATH") from None

    def target_lm_head(self) -> torch.Tensor:
        """[V, H] the target's output-embedding weight (engines without a shared lm_head need a copy)."""
        if self.target_ref is not None and hasattr(self.target_ref, "get_output_embeddings"):
            return self.target_ref.get_output_embeddings().weight.detach().cpu()
        return read_target_tensor(self.target_name(), ("lm_head.weight", "model.embed_tokens.weight"))


def export_drafter(src, fmt: str, out, target=None) -> Path:
    """Write the drafter at `src` (drafter or run folder) as `fmt` into folder `out`.

    `target` (a loaded model, a local path or a hub id) is needed only when the drafter's own
    record of its target cannot be resolved. Returns `out`.
    """
    if fmt not in FORMATS:
        from draftheads.config import suggest

        raise DraftheadsError(f"unknown export format '{fmt}'{suggest(fmt, FORMATS)}; use one of {', '.join(FORMATS)}")
    source = read_source(src, target)
    out = Path(out).expanduser()
    if out.resolve() == source.folder.resolve():
        raise DraftheadsError(f"--out {out} is the drafter folder itself; choose another folder")
    if fmt == "native":
        validate_native(source)
        return write_folder(out, lambda tmp: shutil.copytree(source.folder, tmp, dirs_exist_ok=True))
    check_allowed(source, fmt)
    tensors, config, weights_file = WRITERS[(fmt, source.kind)](source)
    provenance = {"format": fmt, "source": str(source.folder), "head": source.head, "target": source.config.get("target"),
                  "feature_layers": source.config.get("feature_layers")}

    def fill(tmp: Path) -> None:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / weights_file), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")

    return write_folder(out, fill)


def run_export(src: str, fmt: str, out: str, target: str | None = None) -> Path:
    """CLI entry: `draftheads export RUN_OR_DRAFTER --format F --out DIR [--target PATH]`."""
    return export_drafter(src, fmt, out, target)


def read_source(src, target) -> Source:
    folder = resolve_drafter_folder(src)
    config = json.loads((folder / CONFIG).read_text())
    if config.get("format") != FORMAT:
        raise DraftheadsError(f"'{folder}' is not a native draftheads drafter; export reads drafters trained here (load engine folders with load_drafter)")
    if not (folder / WEIGHTS).is_file():
        raise DraftheadsError(f"'{folder / WEIGHTS}' not found; the drafter folder is incomplete")
    return Source(folder, config, load_file(str(folder / WEIGHTS)), target)


def validate_native(source: Source) -> None:
    """The folder must be loadable: its head config builds and its tensors match that head."""
    from draftheads.heads import HEAD_CONFIGS, HEAD_TYPES

    head = dict(source.head)
    cfg = build(HEAD_CONFIGS[head["type"]], head, "head")
    try:
        target_config = source.target_config()
    except DraftheadsError:
        return  # nothing to build against: the config and tensors parsed, which is all we can check
    drafter = HEAD_TYPES[head["type"]].from_target(target_config, cfg)
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items() if not k.startswith(tuple(getattr(drafter, "unsaved_prefixes", ())))}
    found = {k: tuple(v.shape) for k, v in source.state.items()}
    if expected != found:
        diff = sorted(set(expected.items()) ^ set(found.items()))[:3]
        raise DraftheadsError(f"{source.folder / WEIGHTS} does not match its config.json (e.g. {diff}); re-save the drafter")


def write_folder(out: Path, fill) -> Path:
    """Fill a temporary sibling folder, then swap it into place (an existing `out` is replaced)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    fill(tmp)
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


# ---- which formats a drafter may go to --------------------------------------------------------

def refusal(source: Source, fmt: str) -> str | None:
    """Why `source` cannot be exported as `fmt` (None: it can)."""
    from draftheads.heads.engine_formats import find

    kind, family = source.kind, source.family
    if fmt == "native":
        return None
    layout = find(fmt, kind)
    if layout is None:
        return f"{fmt} has no loader for {kind} heads"
    if kind == "medusa":
        if source.head.get("medusa2"):
            return "Medusa-2 heads read the LoRA-adapted target, which engines do not build; merge the adapter into the target first"
        if fmt == "tgi" and source.head.get("lm_head") == "shared" and source.head.get("num_layers", 1) > 1:
            return "TGI shares the target's lm_head only with one block per head (MedusaHeadV2)"
        if fmt == "tgi" and source.head.get("lm_head") == "own" and source.head.get("draft_vocab_size"):
            return "TGI's own Medusa lm heads cover the whole vocabulary, these only the draft vocabulary (head.draft_vocab_size)"
        return None
    if layout.families and family not in layout.families:
        return f"{layout.engine} has no {kind} layer for a {family or 'unknown'} target (it supports {', '.join(layout.families)})"
    if kind == "mtp":
        dense = not any(".mlp.experts." in k for k in source.state)
        block = "a dense-MLP layer like the target's layer 0" if dense else "the target's layer 0"
        return (f"our MTP block is {block}, while vLLM builds module k as layer N+k (a DeepSeek-V2 MoE layer with "
                "per-expert weights); writing it is not implemented")
    if (fmt, kind) not in WRITERS:
        return f"writing {kind} heads for {layout.engine} is not implemented"
    return None


def allowed_formats(source: Source) -> list[str]:
    return [fmt for fmt in FORMATS if refusal(source, fmt) is None]


def check_allowed(source: Source, fmt: str) -> None:
    reason = refusal(source, fmt)
    if reason:
        label = {"eagle3": "EAGLE-3", "eagle": "EAGLE", "medusa": "Medusa", "mtp": "MTP"}[source.kind]
        raise DraftheadsError(f"cannot export this {label} drafter as '{fmt}': {reason}; formats for it: {', '.join(allowed_formats(source))}")


# ---- config.json builders ---------------------------------------------------------------------

LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                "rms_norm_eps", "max_position_embeddings", "vocab_size", "rope_parameters", "bos_token_id", "eos_token_id",
                "pad_token_id")


def layer_config(target, model_type: str, architectures: list[str], dtype: torch.dtype, **extra) -> dict:
    """A one-layer config of `model_type` carrying the target's attention, MLP, rope and norm sizes."""
    d = {k: getattr(target, k) for k in LAYER_FIELDS if getattr(target, k, None) is not None}
    d.setdefault("head_dim", target.hidden_size // target.num_attention_heads)
    rope = d.get("rope_parameters") or {}
    if "rope_theta" in rope or getattr(target, "rope_theta", None) is not None:
        d["rope_theta"] = rope.get("rope_theta", getattr(target, "rope_theta", None))  # older loaders read rope_theta
    name = str(dtype).removeprefix("torch.")
    d.update(model_type=model_type, architectures=architectures, num_hidden_layers=1,
             tie_word_embeddings=bool(getattr(target, "tie_word_embeddings", False)), torch_dtype=name, dtype=name)
    d.update(extra)
    return d


def layer_biases(state: dict, prefix: str = "layer.") -> tuple[bool, bool]:
    """(q/k/v carry biases, o_proj carries a bias) in the native layer."""
    return f"{prefix}self_attn.q_proj.bias" in state, f"{prefix}self_attn.o_proj.bias" in state


# ---- writers: Source -> (tensors, config.json, weights file name) ------------------------------

def medusa_vllm(s: Source):
    h = s.head
    tensors = maps.medusa_to_vllm(s.state, h["num_heads"], h["num_layers"])
    shared = h["lm_head"] == "shared"
    if shared:  # vLLM does not share the target's lm_head: one copy, used by every head
        tensors["lm_heads.0.weight"] = s.target_lm_head().to(s.dtype)
    target = s.config["target"]
    truncated = target["vocab_size"]
    if not shared and h.get("draft_vocab_size"):  # own heads of the draft vocabulary's rows: vLLM's token_map
        tensors["token_map"] = draft_vocab.ids(s.state["d2t"])
        truncated = h["draft_vocab_size"]
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": target["hidden_size"],
              "vocab_size": target["vocab_size"], "truncated_vocab_size": truncated, "num_heads": h["num_heads"],
              "num_hidden_layers": h["num_layers"], "medusa_fc_bias": True, "original_lm_head": shared,
              "torch_dtype": str(s.dtype).removeprefix("torch.")}
    return tensors, config, "model.safetensors"


def medusa_tgi(s: Source):
    h = s.head
    name = s.target_name()
    if not name:
        raise DraftheadsError("TGI loads the target from base_model_name_or_path, but the drafter records no target; pass --target HUB_ID_OR_PATH")
    config = {"medusa_num_heads": h["num_heads"], "medusa_num_layers": h["num_layers"], "base_model_name_or_path": name,
              "hidden_size": s.config["target"]["hidden_size"], "vocab_size": s.config["target"]["vocab_size"]}
    return maps.medusa_to_tgi(s.state, h["num_heads"], h["num_layers"]), config, "medusa_lm_head.safetensors"


def eagle_vllm(s: Source):
    tensors = maps.eagle_to_engine(s.state, fold_fc_bias="fc.bias" in s.state)
    qkv, o = layer_biases(tensors, "layers.0.")
    config = layer_config(s.target_config(), "llama", ["EagleLlamaForCausalLM"], s.dtype, attention_bias=o, qkv_bias=qkv)
    return tensors, config, "model.safetensors"


def eagle_sglang(s: Source):
    qkv, o = layer_biases(s.state)
    if o or (qkv and s.family != "qwen2"):
        raise DraftheadsError("SGLang's EAGLE layers cannot hold this layer's attention biases; export --format vllm")
    model_type, arch = ("qwen2", "Qwen2ForCausalLMEagle") if s.family == "qwen2" else ("llama", "LlamaForCausalLMEagle")
    config = layer_config(s.target_config(), model_type, [arch], s.dtype)
    return maps.eagle_to_engine(s.state, fold_fc_bias=False), config, "model.safetensors"


def eagle3_fields(s: Source, aux_ids: list[int]) -> dict:
    return {"draft_vocab_size": s.head["draft_vocab_size"], "target_hidden_size": s.config["target"]["hidden_size"],
            "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": aux_ids}


def eagle3_vllm(s: Source):
    # vLLM captures layer i's INPUT as aux id i: our layer l's output is id l + 1
    extra = eagle3_fields(s, [layer + 1 for layer in s.head["feature_layers"]])
    config = layer_config(s.target_config(), "llama", ["LlamaForCausalLMEagle3"], s.dtype, **extra, tie_word_embeddings=False)
    return maps.eagle3_to_engine(s.state, "midlayer."), config, "model.safetensors"


def eagle3_sglang(s: Source):
    # SGLang adds 1 itself to ids given in eagle_config: they name the layers whose OUTPUT is read
    extra = eagle3_fields(s, list(s.head["feature_layers"]))
    extra["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": extra.pop("eagle_aux_hidden_state_layer_ids")}
    config = layer_config(s.target_config(), "llama", ["LlamaForCausalLMEagle3"], s.dtype, **extra, tie_word_embeddings=False)
    return maps.eagle3_to_engine(s.state, "midlayer."), config, "model.safetensors"


def eagle3_speculators(s: Source):
    from draftheads.inference.tree import parse_tree

    target = s.target_config()
    model_type = "qwen3" if s.family == "qwen3" else "llama"
    layer = layer_config(target, model_type, [], s.dtype, attention_bias=False, tie_word_embeddings=False)
    layer.pop("architectures")
    tree = parse_tree(s.head.get("default_tree") or "chain:5")
    depth = getattr(tree, "depth", None) or tree.max_depth
    verifier_arch = (s.config.get("target") or {}).get("architecture")
    config = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        **eagle3_fields(s, [layer_id + 1 for layer_id in s.head["feature_layers"]]),  # vLLM's numbering
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": depth, "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": s.target_name(), "architectures": [verifier_arch] if verifier_arch else []},
        },
        "torch_dtype": str(s.dtype).removeprefix("torch."), "dtype": str(s.dtype).removeprefix("torch."),
    }
    return maps.eagle3_to_engine(s.state, "layers.0."), config, "model.safetensors"


WRITERS = {
    ("vllm", "medusa"): medusa_vllm,
    ("tgi", "medusa"): medusa_tgi,
    ("vllm", "eagle"): eagle_vllm,
    ("sglang", "eagle"): eagle_sglang,
    ("vllm", "eagle3"): eagle3_vllm,
    ("sglang", "eagle3"): eagle3_sglang,
    ("speculators", "eagle3"): eagle3_speculators,
}


def read_target_tensor(name: str | None, keys: tuple[str, ...]) -> torch.Tensor:
    """The first of `keys` found in the target's safetensors files (local folder or HF cache)."""
    from safetensors import safe_open

    folder = Path(name) if name and Path(name).is_dir() else None
    if folder is None and name:
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(name, allow_patterns=["*.safetensors", "*.json"], local_files_only=True))
        except (OSError, ValueError):  # not in the local cache (no download here)
            folder = None
    for file in sorted(folder.glob("*.safetensors")) if folder else ():
        with safe_open(str(file), framework="pt") as f:
            for key in keys:
                if key in f.keys():
                    return f.get_tensor(key)
    raise DraftheadsError(f"cannot read the target's lm_head from '{name}' (needed: this engine does not share it); pass --target LOCAL_FOLDER")
