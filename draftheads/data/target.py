"""Load the frozen target: a hub id, a local folder, a .gguf file, or an embedded alias."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gguf
import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_family import attention_kernel
from draftheads.core.targets import locate_target
from draftheads.data.chat import completion_template
from draftheads.data.hardware import resolve_device, resolve_dtype


@dataclass
class TargetConfig:
    """The frozen target model."""

    name: str = doc("smollm2-135m", "hub id, local folder, .gguf file, or the embedded alias 'smollm2-135m'")
    revision: str | None = doc(None, "hub revision (branch, tag or commit)")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = doc("auto", "'auto': bf16 where the hardware has native "
                                                                 "bf16, else fp32")
    device: str = doc("auto", "'auto' (cuda if present, else cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'")
    trust_remote_code: bool = doc(False, "allow custom modeling code from the hub (off unless you trust it)")
    chat_template: str | None = doc(None, "Jinja chat template, or a path to a .jinja file, for tokenizers without one")
    attn_implementation: Literal["sdpa", "eager"] = doc("sdpa", "attention kernel of the target")

    def __post_init__(self):
        check(bool(self.name.strip()),
              "target.name is empty; give a hub id, a local folder, a .gguf file or 'smollm2-135m'")
        check(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
              f"target.device '{self.device}' is not a device; use auto, cpu, cuda, cuda:N or mps")


def load_target_config(spec: str, revision: str | None = None, trust_remote_code: bool = False):
    """The target's transformers config, without loading weights."""
    where, extra = locate_target(spec)
    return from_hub(AutoConfig.from_pretrained, spec, where, revision=revision, trust_remote_code=trust_remote_code,
                    **extra)


def load_target(
    spec: str = "smollm2-135m",
    *,
    dtype: str | torch.dtype = "auto",
    device: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    attn_implementation: str = "sdpa",
    mode: str = "chat",
):
    """Load a causal LM frozen and in eval mode, with a tokenizer that has a chat template (`mode` 'completion', a
    recipe's data.mode: one that writes prompts as raw text, see attach_chat_template).

    Returns (model, tokenizer). `dtype='auto'` is bf16 where the hardware has native bf16
    (GPUs; CPUs with AVX512-BF16/AMX), fp32 otherwise.
    """
    where, extra = locate_target(spec)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device, packed=dtype == "auto" and packed_gguf(where, extra))
    common = dict(revision=revision, trust_remote_code=trust_remote_code, **extra)
    tokenizer = from_hub(AutoTokenizer.from_pretrained, spec, where, **common)
    attach_chat_template(tokenizer, chat_template, spec, mode=mode)
    kernel = attention_kernel(causal_lm_class(spec, where, common), attn_implementation)
    model, info = from_hub(AutoModelForCausalLM.from_pretrained, spec, where, dtype=torch_dtype,
                           attn_implementation=kernel, output_loading_info=True, **common)
    if info.get("missing_keys"):  # e.g. an encoder (BERT) given a freshly initialised LM head: it would run, wrongly
        missing = sorted(info["missing_keys"])
        raise DraftheadsError(f"'{spec}' is not a causal language model: its checkpoint lacks {missing[0]} and "
                              f"{len(missing) - 1} more weights {type(model).__name__} needs; give a causal LM "
                              "(Llama, Qwen, Mistral, Gemma, ...) checkpoint")
    model.to(torch_device)
    freeze(model)
    model.name_or_path = spec
    return model, tokenizer


def causal_lm_class(spec: str, where: str, common: dict) -> type:
    """The class transformers builds for the target (from its config alone), for what it offers (SDPA or not)."""
    config = from_hub(AutoConfig.from_pretrained, spec, where, **common)
    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:   # custom code (auto_map), or not a causal LM (from_pretrained says so): the kernel asked stays
        return object


def packed_gguf(where: str, extra: dict) -> bool:
    """True for a .gguf target holding quantized blocks (transformers keeps them packed where it has kernels)."""
    if "gguf_file" not in extra:
        return False
    try:
        tensors = gguf.GGUFReader(Path(where) / extra["gguf_file"]).tensors
    except Exception:  # noqa: BLE001 - a damaged file: loading it says so in one line
        return False
    floats = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}
    return any(gguf.GGMLQuantizationType(t.tensor_type) not in floats for t in tensors)


def read_chat_template(chat_template: str) -> str:
    """A chat template given as text or as a path to a .jinja file, as its text (what attach_chat_template uses)."""
    path = Path(chat_template).expanduser()
    is_file = len(chat_template) < 4096 and "{" not in chat_template and path.is_file()
    return path.read_text() if is_file else chat_template


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Targets are never trained by the drafter's loss: no grads, eval mode."""
    model.requires_grad_(False)
    model.eval()
    return model


def attach_chat_template(tokenizer, chat_template: str | None, spec: str = "the target",
                         kwargs: dict | None = None, mode: str = "chat") -> None:
    """Use the recipe's template if given (text or a file path); require one in the end. `kwargs` (a recipe's
    data.chat_template_kwargs, e.g. {enable_thinking: false}) become variables of the template itself, so every
    rendering (data generation, the loss masks, evaluation prompts) sees them, as a server passed them would.
    `mode` 'completion' (data.mode) replaces any template with one that writes prompts as raw text (base models):
    every rendering then goes through the same code, so evaluation prompts are rendered as the data's were."""
    if mode == "completion":
        if chat_template:
            raise DraftheadsError("target.chat_template is set but data.mode is completion, which prompts with raw "
                                  "text; drop target.chat_template, or set data.mode: chat")
        tokenizer.chat_template = completion_template(tokenizer)
        return
    if chat_template:
        path = Path(chat_template).expanduser()
        is_file = len(chat_template) < 4096 and "{" not in chat_template and path.is_file()
        tokenizer.chat_template = path.read_text() if is_file else chat_template
    if not getattr(tokenizer, "chat_template", None):
        raise DraftheadsError(
            f"the tokenizer of {spec} has no chat template; set target.chat_template to a Jinja template or a .jinja "
            "file, or data.mode: completion to train on raw-text continuations (a base model)"
        )
    if kwargs:
        if not isinstance(tokenizer.chat_template, str):
            raise DraftheadsError(f"the tokenizer of {spec} has several named chat templates; set target.chat_template "
                                  "to the one to use before giving data.chat_template_kwargs")
        tokenizer.chat_template = template_variables(kwargs) + tokenizer.chat_template


def template_variables(kwargs: dict) -> str:
    """Jinja `set` statements for `kwargs` (their values as JSON literals, which Jinja reads; null as none)."""
    out = []
    for name, value in kwargs.items():
        if not str(name).isidentifier():
            raise DraftheadsError(f"data.chat_template_kwargs: '{name}' is not a template variable name")
        literal = "none" if value is None else json.dumps(value)
        out.append(f"{{%- set {name} = {literal} -%}}")
    return "".join(out)


def from_hub(loader, spec: str, where: str, **kwargs):
    """Call a from_pretrained, turning download/lookup failures into one-line errors."""
    try:
        return loader(where, **kwargs)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise DraftheadsError(f"{spec} needs custom code; set target.trust_remote_code=true if "
                                  "you trust it") from None
        if Path(where).exists():  # the files are here but unusable
            raise DraftheadsError(f"could not load '{spec}': {_first_line(e)}; check its files, or download or convert "
                                  "the model again") from None
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = "pass a local model folder or .gguf file" + (" (HF_HUB_OFFLINE=1 is set)" if offline else "")
        raise DraftheadsError(f"could not load '{spec}': {_first_line(e)}; {hint}") from None
    except Exception as e:  # noqa: BLE001 - a damaged file: safetensors, gguf and tokenizers raise their own types
        raise DraftheadsError(f"could not load '{spec}': its files are damaged ({type(e).__name__}: {_first_line(e)}); "
                              "download or convert the model again, or pass another one") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
