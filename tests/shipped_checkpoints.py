"""Tiny checkpoints of the families that ship MTP layers (tests/fixtures.shipped_mtp_checkpoint writes them)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.families import family_config
from tests.fixtures import make_tokenizer, shipped_mtp_checkpoint

QWEN_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
LAYERS = 4
# families that ship MTP layers beyond tests/families.py's (which every drafter kind runs on)
MORE = {"qwen3_5_moe": ("qwen3_5_moe_text", dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8)),
    # the last layer (the one that becomes MTP) sliding-window with a dense MLP, as MiMo-V2's MTP layers are
    "mimo_v2_flash": ("mimo_v2_flash", dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, v_head_dim=16,
    max_position_embeddings=512, tie_word_embeddings=False, n_routed_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=32, sliding_window=8,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse", "dense"]))}


def shipped_checkpoint(family: str, folder, seed: int = 0) -> Path:
    """A tiny `family` checkpoint with one shipped MTP layer, sharded, in `folder`."""
    tok = make_tokenizer()
    extra = {"layer_types": ["linear_attention", "full_attention"] * 2 + ["full_attention"]} \
        if family in QWEN_FAMILIES else {}
    if family in MORE:
        model_type, sizes = MORE[family]
        config = AutoConfig.for_model(model_type, vocab_size=len(tok), num_hidden_layers=LAYERS + 1, **sizes, **extra)
    else:
        config = family_config(family, len(tok), num_hidden_layers=LAYERS + 1, **extra)
    return shipped_mtp_checkpoint(config, tok, folder, seed)


def load_shipped_target(folder):
    """The checkpoint's target, loaded as users load it (transformers drops the MTP keys), frozen."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.requires_grad_(False).eval()
