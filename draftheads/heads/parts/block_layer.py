"""The draft layer of block-parallel drafters (DFlash): a Qwen3-style decoder layer whose attention also reads the
target's context ("KV injection").

    context c [b, s, H]  hidden_norm(fc(target features)), made once by the drafter and read by every layer
    block   h [b, n, H]  the block's hidden states (at first the embeddings of the anchor and the mask tokens)
    keys, values         [k_proj(c); k_proj(norm(h))], [v_proj(c); v_proj(norm(h))]  (k_norm on both keys)
    queries              q_proj(norm(h)) only: the context is read, never updated

RoPE is applied at absolute positions to the context keys and to the block's queries and keys. Since only the block
makes queries, a context position costs one k/v projection per layer, once: drafting caches those keys and values
(`ContextKV`) and extends them by the positions each step commits. The layer is built from a Qwen3 config with the
target's sizes (q/k norms, SwiGLU, no biases): the class the engines' DFlash loaders build whatever the target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

from draftheads.core.target_family import norm_eps, one_layer_config, whole_head_rope

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values [b, kv_heads, n, head_dim], keys rotated


def block_layer_config(target_config, num_layers: int) -> Qwen3Config:
    """A Qwen3 config with the target's attention, MLP, rope and norm sizes and `num_layers` layers."""
    t = one_layer_config(target_config)
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return Qwen3Config(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=t.num_attention_heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", None) or t.num_attention_heads, head_dim=head_dim,
        hidden_act="silu", max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=norm_eps(t), attention_bias=False, rope_parameters=whole_head_rope(t),
        tie_word_embeddings=False, use_sliding_window=False,
    )


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x [b, heads, n, d] at the positions cos/sin [b, n, d] were made for (the halves-rotation convention of
    the transformers models, so the target's rotary embedding gives the same angles as in its own layers)."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class InjectedAttention(nn.Module):
    """Attention of the block over [context; block]: only block positions make queries."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                    config.head_dim)
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos_sin) -> KV:
        """x [b, n, H] -> rotated, normed keys and values [b, kv_heads, n, d]."""
        b, n, _ = x.shape
        keys = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)).transpose(1, 2)
        values = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(keys, *cos_sin), values

    def forward(self, x: torch.Tensor, cos_sin, context: KV, visible: torch.Tensor) -> torch.Tensor:
        """x [b, n, H] (normed block); context keys/values [b, kv, s, d]; visible [b, n, s + n] bool."""
        b, n, _ = x.shape
        queries = rotate(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)).transpose(1, 2), *cos_sin)
        keys, values = self.keys_values(x, cos_sin)
        keys, values = torch.cat([context[0], keys], dim=2), torch.cat([context[1], values], dim=2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None],
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class BlockLayer(nn.Module):
    """Pre-norm decoder layer: block + attention(norm(block), context), then + SwiGLU(norm(.))."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.self_attn = InjectedAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def context_kv(self, context: torch.Tensor, cos_sin) -> KV:
        """The keys and values this layer reads at context positions [b, s, H]: the context is not normed by the
        layer (the drafter's hidden_norm already did), as in the engines' DFlash layers."""
        return self.self_attn.keys_values(context, cos_sin)

    def forward(self, h: torch.Tensor, cos_sin, context: KV, visible: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos_sin, context, visible)
        return h + self.mlp(self.post_attention_layernorm(h))
