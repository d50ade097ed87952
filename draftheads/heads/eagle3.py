"""EAGLE-3 — Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test".

[h_low; h_mid; h_high] [b, s, 3H] -> fc -> decoder layer over [norm(emb); norm(h)] (2H) -> norm -> draft lm_head

The fused features are the outputs of three target layers (config `feature_layers`, default
{1, N//2-1, N-4}: the hidden states entering layers {2, N//2, N-3}, the engines' default). The layer is the target's
own class with q/k/v widened to 2H inputs; its residual stream stays the H-wide hidden state. The
output head is the drafter's own, over a draft vocabulary (d2t/t2d, heads/draft_vocab.py), started
as the target's rows for it. Loss per unroll step j (heads/draft_layer.py): soft CE against the
target's distribution restricted to the draft vocabulary (renormalised), weighted ttt_decay^j, so
positions whose target argmax lies outside it still count. Configured by `EagleConfig(eagle3=True)`.
"""

from __future__ import annotations

import torch
from torch import nn

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims, text_config
from draftheads.core.tree import DynamicTreeSpec, Tree, parse_tree
from draftheads.heads import draft_layer
from draftheads.heads.common import bind_frozen
from draftheads.heads.draft_layer import LayerDrafting
from draftheads.heads.draft_tree import Sampling
from draftheads.heads.draft_vocab import DraftVocabulary
from draftheads.heads.eagle import EagleConfig
from draftheads.heads.layers import (
    bind_parts,
    build_decoder_layer,
    make_norm,
    run_layer,
    widen_attention_inputs,
)


class Eagle3Drafter(nn.Module):
    """EAGLE-3: fc over three fused target layers into one decoder layer that attends over
    [norm(emb); norm(h)], with its own final norm and lm head over the draft vocabulary.

    The carry at position t is the hidden state: fc(fused features) at first, then the layer's own
    previous output.
    """

    trains_target = False

    def __init__(self, config: EagleConfig, target_config):
        super().__init__()
        dims = target_dims(target_config)
        hidden = dims.hidden_size
        self.config = config
        self.hidden_size, self.vocab_size = hidden, dims.vocab_size
        self.layer = build_decoder_layer(target_config, config.draft_layer or "llama")
        if not hasattr(self.layer, "input_layernorm"):
            raise DraftheadsError(f"{type(self.layer).__name__} has no input_layernorm; EAGLE does not support this target")
        eps = getattr(text_config(target_config), "rms_norm_eps", 1e-6)
        # the target's hidden_states[l + 1] is the output of layer l, the input of layer l + 1
        self.feature_layers = tuple(layer + 1 for layer in config.feature_layers) + (-1,)
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        widen_attention_inputs(self.layer, 2 * hidden)
        self.layer.self_attn.register_forward_pre_hook(_prepend_embeddings, with_kwargs=True)
        self.embed_norm = make_norm(self.layer, hidden, eps)  # the layer's input_layernorm normalises h
        self.norm = make_norm(self.layer, hidden, eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.vocab = DraftVocabulary(self, config.draft_vocab_size, dims.vocab_size)
        bind_frozen(self, _lm_head=None)
        self.reset()

    @classmethod
    def from_target(cls, target_config, cfg: EagleConfig) -> "Eagle3Drafter":
        return cls(cfg, target_config)

    def bind(self, target) -> "Eagle3Drafter":
        """Share the target's frozen embedding, lm_head (for the soft labels) and rotary embedding."""
        bind_parts(self, target, "EAGLE-3", ("embed", "lm_head", "rotary"))
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ---- the two ends of the layer (heads/draft_layer.py) ------------------------------------

    def initial_carry(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, n, 4H] (three fused layers, then the last hidden state) -> fc(fused) [b, n, H]."""
        return self.fc(features[..., : 3 * self.hidden_size])

    def forward_layer(self, carry, tokens, position_ids, visible, cache=None) -> torch.Tensor:
        """carry [b, n, H], tokens [b, n] (x_{t+1} at position t) -> layer output [b, n, H]."""
        emb = self._embed(tokens).to(carry.dtype)
        return run_layer(self.layer, self._rotary, carry, position_ids, visible, cache, draft_embeds=self.embed_norm(emb))

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> [..., Vd] fp32 logits of the own lm head over the draft vocabulary."""
        return self.lm_head(self.norm(out)).float()

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's logits from its final features [..., H], over the draft vocabulary's columns
        (softmax over them is the target's distribution restricted to it)."""
        if self._lm_head is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        return self.vocab.project(self._lm_head, features)

    def vocab_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> [..., V] over the target vocabulary (-inf outside the draft vocabulary)."""
        return self.vocab.widen(self.draft_logits(out))

    def position_loss(self, token_loss: torch.Tensor, rows: torch.Tensor, target_f: torch.Tensor) -> torch.Tensor:
        """The token loss alone: EAGLE-3 does not regress the target's features."""
        return token_loss

    # ---- training (core/drafter.py: TrainableDrafter) -------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        return draft_layer.training_loss(self, batch)

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": [p for p in self.parameters() if p.requires_grad], "lr": lr}]

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first);
        once bound, the own lm head restarts as the target's rows for them."""
        chosen = self.vocab.choose(token_counts)
        if self._lm_head is not None:
            self.lm_head.weight.copy_(self._lm_head.weight[chosen])

    def saved_module(self) -> nn.Module:
        return self

    def save_extras(self, folder) -> None:
        """Everything is in the weights file."""

    def load_extras(self, folder) -> None:
        """Everything is in the weights file."""

    # ---- drafting (core/drafter.py: Drafter) ----------------------------------------------------

    def reset(self) -> None:
        self._drafting = LayerDrafting()

    def default_tree(self) -> Tree | DynamicTreeSpec:
        return parse_tree(self.config.default_tree)

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, 4H], the token after each [b, n]."""
        self._drafting.observe(self, features, next_tokens)

    def propose(self, tree=None, *, temperature=0.0, top_k=0, top_p=1.0, generator=None):
        """Draft a static tree level by level, or an EAGLE-2 dynamic tree (one sequence)."""
        tree = parse_tree(tree) if tree is not None else self.default_tree()
        return self._drafting.propose(self, tree, Sampling(temperature, top_k, top_p, generator))


def _prepend_embeddings(attention: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook on the attention: its input becomes [norm(emb); norm(h)] (2H).

    The decoder layer passes unknown keyword arguments down to its attention; the embeddings
    ride along as `draft_embeds`, while the residual stream stays the H-wide hidden state.
    """
    embeds = kwargs.pop("draft_embeds", None)
    if embeds is None:
        return args, kwargs
    if "hidden_states" in kwargs:
        kwargs["hidden_states"] = torch.cat([embeds, kwargs["hidden_states"]], dim=-1)
    else:
        args = (torch.cat([embeds, args[0]], dim=-1), *args[1:])
    return args, kwargs
