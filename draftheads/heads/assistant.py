"""Gemma 4's assistant drafters (transformers' Gemma4AssistantForCausalLM, shipped beside the target as
`<target>-assistant`), to evaluate and fine-tune: `head.type: assistant`.

step k at the pending token's position p (the same p for every step):
    x = pre_projection([emb(token_k); h_{k-1}])  [b, q, 2H] -> [b, q, A]     h_0: the target's last hidden state
    y = the assistant's layers over x, attending to the target's own keys and values of its last sliding and full
        layers over the committed context (the assistant computes none of its own)
    logits_k = lm_head(y) (or its centroid-masked embedding);  h_k = post_projection(y)  [b, q, H]

The keys and values reach the drafter as features (core/target_family.KV_FEATURE), so verification, training's
online and cached features carry them like hidden states. A tree is drafted one depth per call: every node of a depth
is one more query at p, fed its own token and its parent's h (the steps see each other only through h).
Training unrolls `depth` steps at every anchor t at once (position t + 1, keys up to t), weighted step_decay^(k-1);
an assistant whose lm_head is centroid-masked learns its tokens over the whole lm_head and its centroids as a
classifier of the centroid holding the next token (step_loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig
from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

from draftheads.core.config import check, doc
from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims, text_config
from draftheads.core.target_family import FULL, SLIDING, kv_feature
from draftheads.core.tree import DynamicTreeSpec, Tree, parse_tree
from draftheads.heads.parts.common import (DepthMetrics, batch_features, bind_frozen, check_step_weights, masked_ce,
                                           mean_loss, shift_mask, step_loss_weights)
from draftheads.heads.parts.draft_tree import Sampling, draft_dynamic, draft_static
from draftheads.heads.parts.draft_vocab import vocabulary
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.layers import additive_mask, target_parts
from draftheads.heads.parts.protocol import drafting_methods, new_for_target, one_param_group

MAX_DEPTH = 8
KV_TYPES = (SLIDING, FULL)
PROJECTIONS = ("pre_projection", "post_projection")


@dataclass
class AssistantConfig:
    """Settings of a Gemma 4 assistant drafter (its layers and weights come from the assistant's folder)."""

    type: Literal["assistant"] = doc("assistant", "head type")
    source: str | None = doc(None, "the assistant's folder or hub id (e.g. google/gemma-4-e2b-it-assistant)")
    depth: int = doc(3, "draft steps, each one more query at the pending token's position")
    step_decay: float = doc(0.6, "step k's loss weight is step_decay^(k-1), normalised")
    step_weights: list[float] | None = doc(None, "per-step loss weights, instead of step_decay's")
    train_only: Literal["all", "projections"] = doc("all", "what fine-tunes: everything, or only pre_projection and "
                                                            "post_projection (the layers and lm_head stay)")
    assistant_config: dict | None = doc(None, "the assistant's config.json (read from head.source when not given)")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:depth)")
    init_from: str | None = doc(None, "start from a drafter saved by an earlier fine-tune instead of head.source's")

    def __post_init__(self):
        check_step_weights(self, MAX_DEPTH)
        check(self.source or self.assistant_config or self.init_from,
              "head.source: name the assistant folder or hub id shipped beside the Gemma 4 target (e.g. "
              "google/gemma-4-e2b-it-assistant)")
        parse_tree(self.default_tree, "head.default_tree")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Read the assistant's config from head.source (once: a saved drafter carries it)."""
        if self.assistant_config is None and self.source:
            if self.source.startswith(("/", ".", "~")) and not Path(self.source).expanduser().is_dir():
                raise DraftheadsError(f"head.source '{self.source}' does not exist; give the assistant's folder or "
                                      "hub id")
            try:
                self.assistant_config = AutoConfig.from_pretrained(self.source).to_dict()
            except (OSError, ValueError) as e:
                first = str(e).splitlines()[0][:120]
                raise DraftheadsError(f"head.source '{self.source}' is not an assistant folder this machine has "
                                      f"({first}); download it, or pass its local folder") from None
        if self.assistant_config and self.assistant_config.get("model_type") != "gemma4_assistant":
            raise DraftheadsError(f"head.source '{self.source}' holds a {self.assistant_config.get('model_type')} "
                                  "model, not a Gemma 4 assistant (model_type gemma4_assistant)")

    step_loss_weights = step_loss_weights   # heads/parts/common.py, shared with native MTP layers


def assistant_model(config: AssistantConfig) -> Gemma4AssistantForCausalLM:
    settings = {k: v for k, v in config.assistant_config.items() if k not in ("architectures", "model_type",
                                                                              "transformers_version")}
    return Gemma4AssistantForCausalLM(Gemma4AssistantConfig(**settings))


class AssistantDrafter(nn.Module):
    """A Gemma 4 assistant reading the target's last hidden state and its stored keys and values."""

    feature_layers = (-1, *(kv_feature(kind) for kind in KV_TYPES))
    trains_target = False

    def __init__(self, config: AssistantConfig, target_config):
        super().__init__()
        self.config = config
        dims = target_dims(target_config)
        if text_config(target_config).model_type not in ("gemma4_text", "gemma4"):
            raise DraftheadsError(f"head.type assistant drafts for Gemma 4 targets (its assistants read their keys "
                                  f"and values); this target is {text_config(target_config).model_type}")
        self.hidden_size, self.vocab_size = dims.hidden_size, dims.vocab_size
        self.model = assistant_model(config)
        inner = self.model.config.get_text_config()
        if self.model.backbone_hidden_size != dims.hidden_size or inner.vocab_size != dims.vocab_size:
            raise DraftheadsError(f"this assistant was made for a target of hidden size "
                                  f"{self.model.backbone_hidden_size} and vocabulary {inner.vocab_size}; the target "
                                  f"has {dims.hidden_size} and {dims.vocab_size}")
        self.kv_width = {kind: kv_width(inner, kind) for kind in KV_TYPES}   # heads * head_dim of each stored layer
        self.window = inner.sliding_window
        if config.train_only == "projections":
            for name, module in self.model.named_children():
                module.requires_grad_(name in PROJECTIONS)
        self.vocab = vocabulary(self, None, dims.vocab_size)
        self.default_tree = parse_tree(config.default_tree) if config.default_tree else Tree.chain(config.depth)
        self.files = WeightsOnly(self)
        bind_frozen(self, _embed=None)
        self.reset()

    from_target = classmethod(new_for_target)
    param_groups = one_param_group

    def bind(self, target) -> "AssistantDrafter":
        """Share the target's frozen embedding (as its first layer sees it: Gemma's sqrt(H) inside)."""
        parts = target_parts(target)
        if parts["lm_head"].weight.shape != (self.vocab_size, self.hidden_size):
            raise DraftheadsError("this assistant drafter was built for another target's sizes; use its own target")
        bind_frozen(self, _embed=parts["embed"])
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.model.pre_projection.weight.dtype

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        raise DraftheadsError("a Gemma 4 assistant drafts over the whole vocabulary (or its own centroids)")

    # ---- one step ------------------------------------------------------------------------------------------------

    def split(self, features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """features [b, s, F] -> the last hidden state [b, s, H] and each stored layer's (keys, values) as the
        assistant's attention takes them, [b, heads, s, d]."""
        hidden, rest = features[..., : self.hidden_size], features[..., self.hidden_size :]
        kv, start = {}, 0
        for kind in KV_TYPES:
            width = self.kv_width[kind]
            keys, values = rest[..., start : start + width], rest[..., start + width : start + 2 * width]
            kv[kind] = (as_heads(keys, self.model, kind), as_heads(values, self.model, kind))
            start += 2 * width
        return hidden, kv

    def step(self, tokens, carry, positions, kv, visible) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [b, q], carry [b, q, H], positions [b, q], kv (split's), visible {kind: [b, q, keys] bool} ->
        (the assistant's output [b, q, A], the next step's carry [b, q, H])."""
        x = self.model.pre_projection(torch.cat([self._embed(tokens).to(carry.dtype), carry], dim=-1))
        masks = {kind: additive_mask(visible[kind], x.dtype) for kind in KV_TYPES}
        out = self.model.model(inputs_embeds=x, attention_mask=masks, position_ids=positions, shared_kv_states=kv,
                               use_cache=False, output_hidden_states=True)   # hidden states: keeps every query
        last = out.last_hidden_state
        return last, self.model.post_projection(last)

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """The assistant's output [..., A] -> fp32 logits [..., V] as it computes them."""
        shaped = last.reshape(1, -1, last.shape[-1])
        if self.model.config.use_ordered_embeddings:
            out = self.model.masked_embedding(shaped, self.model.lm_head.weight)
        else:
            out = self.model.lm_head(shaped)
        return out.reshape(*last.shape[:-1], -1).float()

    def visible(self, query_positions: torch.Tensor, key_positions: torch.Tensor, same: torch.Tensor) -> dict:
        """Which keys each query sees: keys before its position (`same`: [b, q, k] within its row), and for the
        sliding layer, only the last `window` positions."""
        before = key_positions[:, None, :] < query_positions[:, :, None]
        near = query_positions[:, :, None] - key_positions[:, None, :] < self.window
        return {FULL: before & same, SLIDING: before & near & same}

    # ---- training ------------------------------------------------------------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Σ_k w_k · CE(step k's prediction of x_{t+k+1}) over every anchor t; metrics per step."""
        hidden, kv = self.split(batch_features(batch, self.dtype))
        ids = batch["input_ids"]
        b, s = ids.shape
        positions = batch.get("position_ids")
        positions = positions if positions is not None else torch.arange(s, device=ids.device)[None].expand(b, -1)
        segment = (positions == 0).cumsum(-1)
        weights = self.config.step_loss_weights()
        metrics = DepthMetrics(self.config.depth, hidden.device)
        loss, carry = hidden.new_zeros(()), hidden
        for k in range(1, self.config.depth + 1):
            n = s - k
            if n <= 0:
                break
            query = positions[:, :n] + 1      # the pending token x_{t+1}'s position, at every step
            same = segment[:, :n, None] == segment[:, None, :]
            visible = self.visible(query, positions, same)
            last, carry = self.step(ids[:, k : k + n], carry[:, :n], query, kv, visible)
            loss_sum, correct, total = self.step_loss(last, batch, k + 1)
            metrics.add(k - 1, loss_sum, correct, total)
            loss = loss + weights[k - 1] * mean_loss(loss_sum, total)
        return loss, metrics.as_dict()

    def step_loss(self, last: torch.Tensor, batch: dict, shift: int):
        """(loss sum, top-1 hits, count) of predicting x_{t+shift} from the assistant's output at t.

        An assistant with the centroid-masked lm_head drafts among the tokens of its top centroids, a choice no
        gradient passes through; so it learns as two classifiers: the token over the whole (tied) lm_head, and the
        centroid holding it over the centroids. Hits are counted as it drafts, masked."""
        if not self.model.config.use_ordered_embeddings:
            return masked_ce(last, batch, shift, self.logits, self.vocab)
        mask = shift_mask(batch, shift)
        rows, labels = last[:, : mask.shape[1]][mask], batch["input_ids"][:, shift:][mask]
        if labels.numel() == 0:
            return last.sum() * 0.0, 0, 0
        embedder = self.model.masked_embedding
        cluster = torch.empty_like(embedder.token_ordering)
        cluster[embedder.token_ordering.long()] = torch.arange(len(cluster), device=cluster.device)
        cluster = cluster // embedder.vocab_size_per_centroid   # token -> the centroid whose block holds it
        loss_sum = (F.cross_entropy(self.model.lm_head(rows).float(), labels, reduction="sum")
                    + F.cross_entropy(embedder.centroids(rows).float(), cluster[labels], reduction="sum"))
        with torch.no_grad():
            correct = (self.logits(rows).argmax(-1) == labels).sum()
        return loss_sum, correct, labels.numel()

    # ---- drafting ------------------------------------------------------------------------------------------------

    reset, observe, propose = drafting_methods(lambda: AssistantDrafting())


def kv_width(text, kind: str) -> int:
    """heads * head_dim of the target layer of `kind` whose keys and values the assistant reads."""
    layer = next(i for i, t in enumerate(text.layer_types) if t == kind)
    per_layer = text.per_layer_config[layer] if getattr(text, "is_heterogeneous", False) else text
    return per_layer.num_key_value_heads * per_layer.head_dim


def as_heads(flat: torch.Tensor, model, kind: str) -> torch.Tensor:
    """[b, s, heads * d] -> [b, heads, s, d] for the assistant layers of `kind`."""
    text = model.config.get_text_config()
    layer = next(i for i, t in enumerate(text.layer_types) if t == kind)
    d = model.model.layers[layer].self_attn.head_dim
    b, s, width = flat.shape
    return flat.reshape(b, s, width // d, d).transpose(1, 2)


class AssistantDrafting:
    """One generation's context: the target's keys and values of every committed position it has processed, its
    last hidden state, and the pending token."""

    def __init__(self):
        self.features: torch.Tensor | None = None   # [1, n, F] every processed position's
        self.pending: torch.Tensor | None = None    # [1] the last committed token, not yet processed

    @torch.no_grad()
    def observe(self, model: AssistantDrafter, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        features = features.to(model.dtype)
        self.features = features if self.features is None else torch.cat([self.features, features], dim=1)
        self.pending = next_tokens[:, -1]

    @torch.no_grad()
    def propose(self, model: AssistantDrafter, tree: Tree | DynamicTreeSpec, sampling: Sampling) -> Proposal:
        if self.features is None:
            raise ValueError("observe the prompt before calling propose")
        hidden, kv = model.split(self.features)
        n = self.features.shape[1]
        keys = torch.arange(n, device=hidden.device)[None]
        outputs = {}   # node -> the h its children are fed (post_projection of its own step)

        def expand(nodes: list[int], parents: list[int], tokens: torch.Tensor) -> torch.Tensor:
            # a node is fed its parent's h; the root, the target's last hidden state
            carry = torch.stack([hidden[:, -1] if v == 0 else outputs[parents[v]] for v in nodes], dim=1)
            query = torch.full((1, len(nodes)), n, device=hidden.device)   # every step at the pending position
            same = torch.ones(1, len(nodes), n, dtype=torch.bool, device=hidden.device)
            last, out = model.step(tokens[:, nodes], carry, query, kv, model.visible(query, keys, same))
            outputs.update({v: out[:, i] for i, v in enumerate(nodes)})
            return model.logits(last)

        root = self.pending
        if isinstance(tree, DynamicTreeSpec):
            tree, tokens, q = draft_dynamic(tree, root, expand, sampling, model.vocab)
        else:
            tree = tree.compacted() if sampling.sampled else tree
            tokens, q = draft_static(tree, root, expand, sampling, model.vocab)
        return Proposal(tree, tokens, q)
