"""TGI: Medusa heads in `medusa_lm_head.safetensors` (MedusaHeadV2 sharing the target's lm_head, or
MedusaHeadV1 with own lm heads, which is also the Medusa v0.1 reference layout), written and read.
"""

from __future__ import annotations

import re
import shlex

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.interop.layout import TGI, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

LAYOUTS = (
    Layout(
        format="tgi", kind="medusa", engine="TGI (MedusaHeadV2: shared lm_head)",
        weights_file="medusa_lm_head.safetensors",
        architectures=None,
        config={"medusa_num_heads": "K", "medusa_num_layers": "1",
                "base_model_name_or_path": "the target's id or path"},
        tensors=(Tensor("{h}.0.linear.weight", ("H", "H")), Tensor("{h}.0.linear.bias", ("H",))),
        read_from=(
            LoaderFile(TGI, "server/text_generation_server/layers/medusa.py",
                       "f32fdd0fa16411512f09a14d0304869b5aeba73c"),
            LoaderFile(TGI, "server/text_generation_server/layers/speculative.py",
                       "c09f5bc93071e2701e201bb374d488e4673fac3d"),
            LoaderFile(TGI, "server/text_generation_server/models/__init__.py", "get_model(): medusa_num_heads branch"),
        ),
        traps=(
            "if config.json has 'architectures' (and it is not MLPSpeculatorPreTrainedModel) "
            "the Medusa heads are not loaded",
            "MedusaHeadV2 asserts medusa_num_layers == 1",
            "MedusaHeadV1 is tried first and wins when {h}.1.weight exists: keep the shared layout free of it",
        ),
    ),
    Layout(
        format="tgi", kind="medusa-own", engine="TGI (MedusaHeadV1: own lm heads)",
        weights_file="medusa_lm_head.safetensors",
        architectures=None,
        config={"medusa_num_heads": "K", "medusa_num_layers": "L",
                "base_model_name_or_path": "the target's id or path"},
        tensors=(
            Tensor("{h}.{l}.linear.weight", ("H", "H")),
            Tensor("{h}.{l}.linear.bias", ("H",)),
            Tensor("{h}.{L}.weight", ("V", "H")),  # the head's own lm head, right after its L blocks
        ),
        read_from=(LoaderFile(TGI, "server/text_generation_server/layers/medusa.py",
                              "f32fdd0fa16411512f09a14d0304869b5aeba73c"),),
        traps=("same 'architectures' trap as the shared layout; this is also the Medusa v0.1 reference layout",),
    ),
)


def medusa_to_tgi(state: dict, num_heads: int, num_layers: int) -> dict:
    """Medusa v0.1 / TGI names: {h}.{l}.linear.* then {h}.{L}.weight for an own lm head."""
    out = {}
    for h in range(num_heads):
        for l in range(num_layers):
            for part in ("weight", "bias"):
                out[f"{h}.{l}.linear.{part}"] = state[f"heads.{h}.{l}.linear.{part}"]
        if f"lm_heads.{h}.weight" in state:
            out[f"{h}.{num_layers}.weight"] = state[f"lm_heads.{h}.weight"]
    return out


def medusa_from_tgi(tensors: dict, num_layers: int) -> dict:
    """The inverse of medusa_to_tgi."""
    state = {}
    for name, tensor in tensors.items():
        if m := re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", name):
            state[f"heads.{m[1]}.{m[2]}.linear.{m[3]}"] = tensor
        elif (m := re.fullmatch(r"(\d+)\.(\d+)\.weight", name)) and int(m[2]) == num_layers:
            state[f"lm_heads.{m[1]}.weight"] = tensor
    return state


def write_medusa(s: SavedDrafter):
    """medusa_lm_head.safetensors beside a config.json without architectures (TGI's trap)."""
    h = s.head
    name = s.target_name()
    if not name:
        raise DraftheadsError("TGI loads the target from base_model_name_or_path, but the drafter records no target; "
                              "pass --target HUB_ID_OR_PATH")
    config = {"medusa_num_heads": h.num_heads, "medusa_num_layers": h.num_layers, "base_model_name_or_path": name,
              "hidden_size": s.config["target"]["hidden_size"], "vocab_size": s.config["target"]["vocab_size"]}
    return medusa_to_tgi(s.state, h.num_heads, h.num_layers), config, "medusa_lm_head.safetensors"


def read_medusa(config: dict, tensors: dict) -> tuple[dict, dict]:
    """(head structure, native state) of a TGI / Medusa v0.1 folder: own lm heads when the file has them."""
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    state = medusa_from_tgi(tensors, num_layers)
    own = any(k.startswith("lm_heads.") for k in state)
    if own:
        state["lm_heads_initialised"] = torch.tensor(True)
    return {"type": "medusa", "num_heads": num_heads, "num_layers": num_layers,
            "lm_head": "own" if own else "shared"}, state


def refusal(saved: SavedDrafter) -> str | None:
    """Why TGI cannot load these Medusa heads (None: it can)."""
    head = saved.head
    if head.lm_head == "shared" and head.num_layers > 1:
        return "TGI shares the target's lm_head only with one block per head (MedusaHeadV2)"
    if head.lm_head == "own" and head.draft_vocab_size:
        return ("TGI's own Medusa lm heads cover the whole vocabulary, these only the draft vocabulary "
                "(head.draft_vocab_size)")
    return None


WRITERS = {"medusa": write_medusa}


def serve_command(s: SavedDrafter, model: str, target: str) -> str:
    """TGI given the Medusa folder `model` as the model: it loads the target its base_model_name_or_path names and
    speculates with every head."""
    return f"text-generation-launcher --model-id {shlex.quote(model)}"
