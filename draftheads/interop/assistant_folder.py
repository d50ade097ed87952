"""Gemma 4 assistant folders (heads/assistant.py): read into a drafter, and written back as a folder of the same
layout with the fine-tuned weights.

    drafter = shipped_assistant(target, head_config({"type": "assistant", "source": "google/gemma-4-e2b-it-assistant"}))
    export_drafter(run, "assistant", out)      # transformers' Gemma4AssistantForCausalLM.from_pretrained(out) loads it

Reading is transformers' own from_pretrained of the folder (its key conversions, tied lm_head, shards). Writing is
its save_pretrained, in the dtype the folder had, with the folder's other files (generation_config.json with
num_assistant_tokens, tokenizer files, model card) linked or copied beside; the source is only read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers.models.gemma4_assistant import Gemma4AssistantForCausalLM

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import link_or_copy
from draftheads.heads.assistant import assistant_model
from draftheads.heads.factory import bound_drafter
from draftheads.interop.layout import Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

TRANSFORMERS = "huggingface/transformers"
WRITTEN = ("config.json", "model.safetensors", "model.safetensors.index.json")

LAYOUTS = (
    Layout(
        format="assistant", kind="assistant", engine="transformers (Gemma4AssistantForCausalLM: generate(assistant_"
                                                     "model=...))",
        weights_file="model.safetensors", architectures=("Gemma4AssistantForCausalLM",),
        config={"model_type": "gemma4_assistant", "backbone_hidden_size": "H", "text_config": "the assistant's "
                "layers (every one KV-shared: num_kv_shared_layers = num_hidden_layers)",
                "use_ordered_embeddings": "as shipped (the centroid-masked lm_head)"},
        tensors=(Tensor("pre_projection.weight", ("A", "2H")), Tensor("post_projection.weight", ("H", "A"))),
        families=("gemma4", "gemma4_text"),
        read_from=(LoaderFile(TRANSFORMERS, "src/transformers/models/gemma4_assistant/modeling_gemma4_assistant.py",
                              "5.24.0"),
                   LoaderFile(TRANSFORMERS, "src/transformers/generation/candidate_generator.py "
                                            "(SinglePositionMultiTokenCandidateGenerator)", "5.24.0")),
        traps=(
            "every draft step is a query at the pending token's position; the steps see each other only through h",
            "the assistant attends to the target's keys and values of its last sliding and full layers, its own none",
            "lm_head is tied to the assistant's embed_tokens; token_ordering is a buffer of the centroid head",
        ),
    ),
)


def refusal(saved: SavedDrafter) -> str | None:
    return None


def shipped_assistant(target, config):
    """The assistant `config.source` names, as a drafter bound to `target` (on its device and dtype)."""
    drafter = bound_drafter(config, target)
    try:
        shipped = Gemma4AssistantForCausalLM.from_pretrained(config.source, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise DraftheadsError(f"cannot read the assistant folder '{config.source}' ({str(e).splitlines()[0][:150]})"
                              "; pass the folder shipped beside the target (head.source)") from None
    state = {k: v for k, v in shipped.state_dict().items()}
    drafter.model.load_state_dict(state, strict=True)
    return drafter


def write_assistant(saved: SavedDrafter, tmp: Path) -> dict:
    """Fill `tmp` with the assistant folder of the drafter: its weights in the source's dtype, and the source's
    other files beside them."""
    model = assistant_model(saved.head)
    state = {k.removeprefix("model."): v for k, v in saved.state.items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:   # the lm_head is tied to embed_tokens
        raise DraftheadsError(f"{saved.folder} is not an assistant drafter of its config (missing {missing[:2]}, "
                              f"unexpected {unexpected[:2]}); re-save it")
    dtype = saved.head.assistant_config.get("dtype") or saved.head.assistant_config.get("torch_dtype")
    model.to(getattr(torch, str(dtype).removeprefix("torch."), torch.float32) if dtype else torch.float32)
    model.save_pretrained(tmp)
    source = Path(saved.head.source).expanduser() if saved.head.source else None
    copied = []
    if source is not None and source.is_dir():
        for entry in sorted(source.iterdir()):
            if entry.name in WRITTEN or entry.name.endswith(".safetensors") or (tmp / entry.name).exists():
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name, copy_function=link_or_copy)
            else:
                link_or_copy(entry, tmp / entry.name)
            copied.append(entry.name)
    return {"assistant": str(source) if source else None, "files_beside": copied}


WRITERS = {"assistant": write_assistant}   # fills the export folder (interop/export.py: FOLDER_FORMATS)
