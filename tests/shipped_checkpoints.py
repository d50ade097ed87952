"""Tiny checkpoints of the families that ship MTP layers (tests/fixtures.shipped_mtp_checkpoint writes them)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.families import family_config
from tests.fixtures import make_tokenizer, shipped_mtp_checkpoint

QWEN_FAMILIES = ("qwen3_next", "qwen3_5")
LAYERS = 4


def shipped_checkpoint(family: str, folder, seed: int = 0) -> Path:
    """A tiny `family` checkpoint with one shipped MTP layer, sharded, in `folder`."""
    tok = make_tokenizer()
    extra = {"layer_types": ["linear_attention", "full_attention"] * 2 + ["full_attention"]} \
        if family in QWEN_FAMILIES else {}
    return shipped_mtp_checkpoint(family_config(family, len(tok), num_hidden_layers=LAYERS + 1, **extra), tok,
                                  folder, seed)


def load_shipped_target(folder):
    """The checkpoint's target, loaded as users load it (transformers drops the MTP keys), frozen."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.requires_grad_(False).eval()
