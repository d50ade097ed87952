"""EAGLE — Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty" (EAGLE-1/2), and Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test".

EAGLE-1/2: [emb(x_{t+1}); f_t] [b, s, 2H] -> fc -> decoder layer -> f̂_{t+1} -> target lm_head
EAGLE-3:   [h_low; h_mid; h_high] [b, s, 3H] -> fc -> layer over [norm(emb); norm(h)] -> norm -> draft lm_head

The decoder layer is the target's own class (heads/layers.py). Losses, per unroll step j:
EAGLE-1/2  feature_loss_weight · SmoothL1(f̂, f) + token_loss_weight · soft CE against the target's
           distribution softmax(lm_head(f_{t+1})) (not the sampled next token);
EAGLE-3    soft CE against the target's distribution restricted to the draft vocabulary
           (renormalised), so positions whose target argmax lies outside it still count.
Training-time test (ttt_steps > 1, either variant): step j feeds step j-1's outputs back in and
attends to exactly the keys depth-(j+1) drafting would see; losses weighted ttt_decay^j.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.config import check, doc
from draftheads.errors import DraftheadsError
from draftheads.heads import draft_vocab
from draftheads.heads.common import DepthMetrics, batch_features, bind_frozen, mean_loss, shift_mask, target_dims, text_config
from draftheads.heads.draft_tree import Sampling, draft_dynamic, draft_static, node_depth
from draftheads.heads.layers import (
    KVCache, build_decoder_layer, causal_visible, make_norm, run_layer, target_parts, tree_visible, ttt_visible,
    widen_attention_inputs,
)
from draftheads.inference.drafter import Proposal
from draftheads.inference.tree import DynamicTreeSpec, Tree, parse_tree

MAX_TTT_STEPS = 16


@dataclass
class EagleConfig:
    """EAGLE layer hyper-parameters (hidden size, vocabulary and layer count come from the target)."""

    type: Literal["eagle"] = doc("eagle", "head type")
    eagle3: bool = doc(False, "EAGLE-3: fused low/mid/high features, training-time test, reduced draft vocabulary")
    feature_layers: list[int] | None = doc(None, "EAGLE-3: target layers whose outputs are fused (default {2, N//2, N-3})")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens. EAGLE-3: its own "
                                             "lm_head (default min(32000, target vocab)); EAGLE-1/2: rows of the target's lm_head "
                                             "(default: the full vocabulary), making each draft step several times cheaper")
    ttt_steps: int = doc(1, "training-time test: unroll this many steps on the drafter's own outputs")
    ttt_decay: float = doc(0.8, "training-time test: step j's loss is weighted decay^j")
    feature_loss_weight: float = doc(1.0, "EAGLE-1/2: weight of SmoothL1(f̂, f)")
    token_loss_weight: float = doc(0.1, "EAGLE-1/2: weight of the token cross-entropy")
    input_noise: float = doc(0.2, "width of the uniform noise added to input features during training (0 = off)")
    token_loss_fraction: float = doc(1.0, "share of positions, drawn anew each training step, that get the vocabulary-sized "
                                          "token loss (the feature loss uses all); < 1 trades a noisier token loss for speed")
    default_tree: str = doc("dynamic:8,6,48", "tree used when the caller gives none (chain:K, dynamic:TOPK,DEPTH,TOTAL)")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check(1 <= self.ttt_steps <= MAX_TTT_STEPS, f"head.ttt_steps must be between 1 and {MAX_TTT_STEPS}, got {self.ttt_steps}")
        check(0 < self.ttt_decay <= 1, f"head.ttt_decay must be in (0, 1], got {self.ttt_decay}")
        check(self.input_noise >= 0, f"head.input_noise must be >= 0, got {self.input_noise}")
        check(0 < self.token_loss_fraction <= 1, f"head.token_loss_fraction must be in (0, 1], got {self.token_loss_fraction}")
        check(self.token_loss_weight >= 0 and self.feature_loss_weight >= 0, "head loss weights must be >= 0")
        check(self.draft_vocab_size is None or self.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
        if self.feature_layers is not None:
            check(len(self.feature_layers) == 3, f"head.feature_layers must list 3 target layers, got {len(self.feature_layers)}")
            check(self.eagle3, "head.feature_layers only applies with head.eagle3: true")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        if not self.eagle3:
            if self.draft_vocab_size is not None:
                check(self.draft_vocab_size <= vocab_size, f"head.draft_vocab_size {self.draft_vocab_size} exceeds the target vocabulary ({vocab_size})")
            return
        if self.feature_layers is None:
            self.feature_layers = [2, num_layers // 2, num_layers - 3] if num_layers >= 6 else [0, num_layers // 2, num_layers - 1]
        for layer in self.feature_layers:
            check(0 <= layer < num_layers, f"head.feature_layers: layer {layer} does not exist (the target has {num_layers} layers)")
        if self.draft_vocab_size is None:
            self.draft_vocab_size = min(32000, vocab_size)
        check(self.draft_vocab_size <= vocab_size, f"head.draft_vocab_size {self.draft_vocab_size} exceeds the target vocabulary ({vocab_size})")

    @property
    def depth(self) -> int:
        return MAX_TTT_STEPS  # autoregressive: any draft depth


class EagleDrafter(draft_vocab.DraftVocabulary, nn.Module):
    """One draft decoder layer of the target's own class, run autoregressively on its own features.

    The "carry" fed at position t is what the layer continues from: EAGLE-1/2 the feature f_t
    (fused with emb(x_{t+1}) by fc), EAGLE-3 the hidden state fc(fused features) at step 0 and
    the layer's previous output afterwards. The layer's output at t is the next position's carry.
    """

    def __init__(self, config: EagleConfig, target_config):
        super().__init__()
        dims = target_dims(target_config)
        self.config = config
        self.hidden_size, self.vocab_size = dims.hidden_size, dims.vocab_size
        hidden = dims.hidden_size
        self.layer = build_decoder_layer(target_config)
        if not hasattr(self.layer, "input_layernorm"):
            raise DraftheadsError(f"{type(self.layer).__name__} has no input_layernorm; EAGLE does not support this target")
        if config.eagle3:
            eps = getattr(text_config(target_config), "rms_norm_eps", 1e-6)
            self.feature_layers = tuple(layer + 1 for layer in config.feature_layers) + (-1,)
            self.fc = nn.Linear(3 * hidden, hidden, bias=False)
            widen_attention_inputs(self.layer, 2 * hidden)
            self.layer.self_attn.register_forward_pre_hook(_prepend_embeddings, with_kwargs=True)
            self.embed_norm = make_norm(self.layer, hidden, eps)  # the layer's input_layernorm normalises h
            self.norm = make_norm(self.layer, hidden, eps)
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        else:
            self.feature_layers = (-1,)
            self.fc = nn.Linear(2 * hidden, hidden, bias=True)
            self.layer.input_layernorm = nn.Identity()  # f is already normalised by the target
        if config.draft_vocab_size is not None:
            draft_vocab.add_buffers(self, config.draft_vocab_size, dims.vocab_size)
        self._shared_rows = draft_vocab.SharedRows()  # EAGLE-1/2 with a draft vocabulary: the target lm_head's rows
        self.reset()

    @classmethod
    def from_target(cls, target_config, cfg: EagleConfig) -> "EagleDrafter":
        dims = target_dims(target_config)
        cfg.resolve(dims.num_layers, dims.vocab_size)
        return cls(cfg, target_config)

    def bind(self, target) -> "EagleDrafter":
        """Share the target's frozen embedding, lm_head and rotary embedding (never trained or saved)."""
        parts = target_parts(target)
        out_features, in_features = parts["lm_head"].weight.shape
        if (in_features, out_features) != (self.hidden_size, self.vocab_size):
            raise DraftheadsError(
                f"this EAGLE drafter was built for hidden size {self.hidden_size} and vocab {self.vocab_size}, "
                f"but the target has {in_features} and {out_features}; use the target it was trained on"
            )
        bind_frozen(self, _embed=parts["embed"], _lm_head=parts["lm_head"], _rotary=parts["rotary"])
        return self

    # ---- the model ----------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def _initial_carry(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, n, F] -> carry [b, n, H] from the target's own hidden states."""
        if self.config.eagle3:
            return self.fc(features[..., : 3 * self.hidden_size])
        return features[..., -self.hidden_size :]

    def _forward(self, carry, tokens, position_ids, visible, cache=None) -> torch.Tensor:
        """carry [b, n, H], tokens [b, n] (x_{t+1} at position t) -> layer output [b, n, H]."""
        emb = self._embed(tokens).to(carry.dtype)
        if self.config.eagle3:
            return run_layer(self.layer, self._rotary, carry, position_ids, visible, cache, draft_embeds=self.embed_norm(emb))
        hidden = self.fc(torch.cat([emb, carry], dim=-1))
        return run_layer(self.layer, self._rotary, hidden, position_ids, visible, cache)

    def _draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] (EAGLE-1/2, target lm_head) or [..., Vd] (EAGLE-3's own head, or the target
        lm_head's rows for the draft vocabulary), fp32."""
        if self.config.eagle3:
            return self.lm_head(self.norm(out)).float()
        if self.has_draft_vocab:
            return self._shared_rows.logits(self._lm_head, self.d2t, out)
        return self._lm_head(out.to(self._lm_head.weight.dtype)).float()

    def _vocab_logits(self, out: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] over the target vocabulary (-inf outside a draft vocabulary)."""
        return self.widen_logits(self._draft_logits(out))

    # ---- training -----------------------------------------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Σ_j ttt_decay^j · mean loss of unroll step j (step j drafts depth j+1); metrics per step."""
        features = batch_features(batch, self.dtype)
        metrics = DepthMetrics(self.config.ttt_steps, features.device)
        loss = features.new_zeros(())
        for step, out in enumerate(self.unroll(features, batch["input_ids"], batch.get("position_ids"))):
            loss_sum, correct, total = self._step_loss(out, features, batch, step)
            metrics.add(step, loss_sum, correct, total)
            loss = loss + self.config.ttt_decay**step * mean_loss(loss_sum, total)
        return loss, metrics.as_dict()

    def unroll(self, features: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None):
        """Training-time test: yield the layer output [b, s-1, H] of each of `ttt_steps` steps.

        Step 0 reads the target's features; step j reads step j-1's outputs shifted by one
        position and attends, through one growing cache, to exactly the keys drafting depth j+1
        from anchor p - j would see (layers.ttt_visible). In training mode the input features
        get uniform noise U(-w/2, w/2).
        """
        n = input_ids.shape[1] - 1  # position t reads x_{t+1}
        tokens = input_ids[:, 1:]
        segments = position_ids[:, :n] if position_ids is not None else None
        rope = segments if segments is not None else torch.arange(n, device=input_ids.device)[None]
        inputs = features[:, :n]
        if self.training and self.config.input_noise > 0:
            inputs = inputs + (torch.rand_like(inputs) - 0.5) * self.config.input_noise
        carry = self._initial_carry(inputs)
        cache = KVCache() if self.config.ttt_steps > 1 else None
        for step in range(self.config.ttt_steps):
            visible = ttt_visible(step, n, segments, input_ids.device)
            out = self._forward(carry, tokens, rope, visible, cache)
            yield out
            carry = torch.cat([carry[:, :1], out[:, :-1]], dim=1)  # position p continues from p - 1's output

    def _step_loss(self, out: torch.Tensor, features: torch.Tensor, batch: dict, step: int):
        """Loss of unroll step `step`: out[:, p] (anchor a = p - step) predicts f_{p+1} and x_{p+2}.

        Returns (loss_sum, top-1 hits, count) over the positions that got the token loss: all counted
        positions, or in training a random `token_loss_fraction` of them. The projection onto the
        vocabulary (three [m, H] x [H, V] products with the target's logits) is most of a step's cost
        on a CPU; the feature loss is cheap and always averages over every counted position.
        """
        mask = shift_mask(batch, step + 2)  # [b, s - step - 2], indexed by the anchor
        span = mask.shape[1]
        rows = out[:, step : step + span][mask]  # [m, H]
        labels = batch["input_ids"][:, step + 2 :][mask]
        if labels.numel() == 0:
            return out.sum() * 0.0, 0, 0  # keeps every parameter in the graph (DDP)
        target_f = features[:, step + 1 : step + 1 + span, -self.hidden_size :][mask]  # f_{p+1}
        pick = self._token_loss_positions(labels.numel(), labels.device)
        logits = self._draft_logits(rows[pick])
        with torch.no_grad():
            target_p = self.target_logits(target_f[pick]).softmax(-1)
        loss = -(target_p * logits.log_softmax(-1)).sum(-1)  # soft CE vs the target's distribution
        if not self.config.eagle3:
            smooth_l1 = F.smooth_l1_loss(rows.float(), target_f.float(), reduction="none").mean(-1)
            loss = self.config.feature_loss_weight * smooth_l1.mean() + self.config.token_loss_weight * loss
        guess = logits.argmax(-1)
        if self.has_draft_vocab:
            guess = self.draft_ids[guess]
        return loss.sum(), (guess == labels[pick]).sum(), guess.numel()

    def _token_loss_positions(self, m: int, device) -> torch.Tensor | slice:
        """Which of m counted positions get the token loss: all of them, or in training a random share."""
        fraction = self.config.token_loss_fraction
        if not self.training or fraction >= 1:
            return slice(None)
        return torch.randperm(m, device=device)[: max(1, round(fraction * m))]

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor, init_from_target: bool = True) -> None:
        """Draft vocabulary = the draft_vocab_size most frequent tokens (ties: lower id first).

        token_counts [V]: how often each token is a loss-masked (target-generated) token. Builds
        d2t (target id = draft id + d2t[draft id]) and t2d ([V] bool). EAGLE-3 with `init_from_target`
        and a bound target: its own lm_head starts as the target's rows for those tokens.
        """
        chosen = super().set_draft_vocab(token_counts)
        if self.config.eagle3 and init_from_target and hasattr(self, "_lm_head"):
            self.lm_head.weight.copy_(self._lm_head.weight[chosen])

    # ---- drafting (the Drafter protocol) -------------------------------------------------------

    def reset(self) -> None:
        self._cache = KVCache()
        self._committed = 0  # cached positions that belong to committed tokens
        self._root_out: torch.Tensor | None = None  # [b, H] layer output at the last committed position
        self._root_token: torch.Tensor | None = None  # [b] the pending token

    def default_tree(self) -> Tree | DynamicTreeSpec:
        return parse_tree(self.config.default_tree)

    @torch.no_grad()
    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, F], the token after each [b, n]."""
        self._cache.truncate(self._committed)
        n = next_tokens.shape[1]
        positions = torch.arange(self._committed, self._committed + n, device=next_tokens.device)[None]
        visible = causal_visible(None, 1, n, past=self._committed, device=next_tokens.device)
        carry = self._initial_carry(features.to(self.dtype))
        out = self._forward(carry, next_tokens, positions, visible, self._cache)
        self._committed += n
        self._root_out, self._root_token = out[:, -1], next_tokens[:, -1]

    @torch.no_grad()
    def propose(self, tree=None, *, temperature=0.0, top_k=0, top_p=1.0, generator=None) -> Proposal:
        """Draft a static tree level by level, or an EAGLE-2 dynamic tree (one sequence)."""
        if self._root_out is None:
            raise ValueError("observe the prompt before calling propose")
        tree = parse_tree(tree) if tree is not None else self.default_tree()
        self._cache.truncate(self._committed)
        sampling = Sampling(temperature, top_k, top_p, generator)
        state = {"out": {0: self._root_out}, "columns": {}}
        expand = functools.partial(self._expand, state)
        columns = self.draft_columns()
        if isinstance(tree, DynamicTreeSpec):
            tree, tokens, q = draft_dynamic(tree, self._root_token, expand, sampling, columns)
        else:
            tokens, q = draft_static(tree, self._root_token, expand, sampling, columns)
        return Proposal(tree, tokens, q)

    def _expand(self, state: dict, nodes: list[int], parents: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Feed tree `nodes` (one depth) through the layer; logits for their children [b, n, V or Vd]."""
        if nodes == [0]:
            return self._draft_logits(self._root_out)[:, None]
        past = len(self._cache)
        for i, node in enumerate(nodes):
            state["columns"][node] = past + i
        depths = [node_depth(parents, node) for node in nodes]
        # the root sits at the last committed position; a node of depth d at d positions later
        positions = torch.tensor(depths, device=tokens.device)[None] + self._committed - 1
        visible = tree_visible(nodes, parents, state["columns"], past + len(nodes), self._committed, tokens.device)
        carry = torch.stack([state["out"][parents[node]] for node in nodes], dim=1)
        out = self._forward(carry, tokens[:, nodes], positions, visible, self._cache)
        for i, node in enumerate(nodes):
            state["out"][node] = out[:, i]
        return self._draft_logits(out)


def _prepend_embeddings(attention: nn.Module, args: tuple, kwargs: dict):
    """EAGLE-3 forward pre-hook on the attention: its input becomes [norm(emb); norm(h)] (2H).

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
