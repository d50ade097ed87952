"""Tiny random targets of every family people serve, built from transformers' own config and model classes.

Each family keeps what sets it apart (its rotary per layer type, embedding scale, softcaps, sliding windows, q/k
norms, NoPE layers, MLA, MoE, linear attention), at fixture sizes: 4 layers, hidden 64, 4 heads, vocabulary of the
fixture tokenizer. `tests/fixtures.FAMILIES` stays the four plain families most tests run on.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.fixtures import make_tokenizer

MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
# family -> (model_type, overrides of the fixture sizes)
FAMILY_CONFIGS = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {}),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "qwen3_moe": ("qwen3_moe", dict(head_dim=16, num_experts=4, **MOE)),
    "qwen3_next": ("qwen3_next", dict(
        head_dim=16, num_experts=4, shared_expert_intermediate_size=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, **MOE)),
    "qwen3_5": ("qwen3_5_text", dict(
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)),
    "gemma2": ("gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=64)),
    # 4 layers: the pattern of 6 would make every layer local; Gemma 3's real ones mix 5 local with 1 global
    "gemma3_text": ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=64,
                                         layer_types=["sliding_attention", "full_attention"] * 2)),
    "gemma4": ("gemma4_text", dict(
        head_dim=16, global_head_dim=32, sliding_window=64, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=384, layer_types=["sliding_attention", "full_attention"] * 2)),
    "phi3": ("phi3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", dict(embedding_multiplier=12.0, logits_scaling=4.0, residual_multiplier=0.22,
                                attention_multiplier=0.0625)),
    "cohere2": ("cohere2", dict(head_dim=16, sliding_window=64, logit_scale=0.25,
                                layer_types=["sliding_attention", "full_attention"] * 2)),
    "smollm3": ("smollm3", dict(no_rope_layer_interval=2)),
    "glm4_moe": ("glm4_moe", dict(head_dim=16, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1,
                                  n_group=1, topk_group=1, **MOE)),
    "deepseek_v3": ("deepseek_v3", dict(
        q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8,
        n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        num_key_value_heads=4, **MOE)),   # MLA: as many key/value heads as query heads
}
FAMILIES = tuple(FAMILY_CONFIGS)
HYBRID = ("qwen3_next", "qwen3_5")   # most layers are linear attention with a recurrent state


def family_config(family: str, vocab_size: int, **overrides):
    model_type, extra = FAMILY_CONFIGS[family]
    sizes = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    sizes.update(extra)
    sizes.update(overrides)
    return AutoConfig.for_model(model_type, **sizes)


def family_target(family: str, tokenizer=None, seed: int = 0, **overrides):
    """A frozen, eval-mode tiny random causal LM of `family` (fp32, CPU), its lm_head sharpened like the fixtures'."""
    tokenizer = tokenizer or make_tokenizer()
    config = family_config(family, len(tokenizer), **overrides)
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(config, name, getattr(tokenizer, name))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.requires_grad_(False).eval()
    return model
