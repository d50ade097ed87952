"""One draft decoder layer run autoregressively on its own outputs: what EAGLE-1/2 (heads/eagle.py)
and EAGLE-3 (heads/eagle3.py) share.

The "carry" fed at position t is what the layer continues from: made from the target's features
at first (`initial_carry`), then the layer's own previous output. A drafter supplies its two ends
(core/drafter.py's `DraftLayer`): how carry and token enter the layer (`forward_layer`) and how its output becomes
logits (`draft_logits`), plus what a position's loss adds to the token loss (`position_loss`: EAGLE-1/2's
feature regression); this module runs the rest:

- training: the training-time test (`unroll`: step j feeds step j-1's outputs back in and attends
  to exactly the keys depth-(j+1) drafting would see) and its loss (`training_loss`): per step, the recipe's token
  loss (soft CE against the target's distribution of x_{p+2} by default), weighted ttt_decay^j by default; with
  head.ttt_mode: harmonised (HASS, arXiv 2408.15766) the earlier steps' outputs and keys reach later steps without
  gradient, as given context, and each step adds the distillation term over the target's top-10 tokens;
- drafting: `LayerDrafting`, the layer's KV cache over the committed positions and the static or
  EAGLE-2 dynamic trees grown on top of it, one depth per layer call.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch

from draftheads.core.config import check, doc
from draftheads.core.drafter import DraftLayer, Proposal
from draftheads.core.tree import DynamicTreeSpec, Tree, parse_tree
from draftheads.heads.parts.common import DepthMetrics, batch_features, shift_mask
from draftheads.heads.parts.draft_tree import Sampling, draft_dynamic, draft_static, node_depth
from draftheads.heads.parts.layers import KVCache, causal_visible, tree_visible, ttt_visible
from draftheads.heads.parts.objective import (Objective, depth_weights, objective_of, per_depth_mean, take_objective,
                                              token_loss)

MAX_TTT_STEPS = 16
TttMode = Literal["teacher", "harmonised"]
HASS_TOP_K = 10  # HASS's top-k distillation over the target's 10 most likely tokens (its default)


def ttt_mode_setting():
    """head.ttt_mode of the heads that unroll this layer (EAGLE-1/2, EAGLE-3)."""
    return doc("teacher", "training-time test: 'teacher' (every step's loss against the target's distribution, "
                          "gradients through the unroll) or 'harmonised' (HASS: later steps read the earlier steps' "
                          "outputs as given, without gradient, and each step's loss adds the target's top-10 tokens' "
                          "distillation term)")


def check_unroll(config) -> None:
    """The settings EAGLE-1/2 and EAGLE-3 configs share: the unroll, the input noise, the token-loss sample, the
    draft vocabulary's size and the default tree (a bad or oversized tree is refused with the recipe)."""
    check(1 <= config.ttt_steps <= MAX_TTT_STEPS,
          f"head.ttt_steps must be between 1 and {MAX_TTT_STEPS}, got {config.ttt_steps}")
    check(0 < config.ttt_decay <= 1, f"head.ttt_decay must be in (0, 1], got {config.ttt_decay}")
    check(config.input_noise >= 0, f"head.input_noise must be >= 0, got {config.input_noise}")
    check(0 < config.token_loss_fraction <= 1,
          f"head.token_loss_fraction must be in (0, 1], got {config.token_loss_fraction}")
    check(config.draft_vocab_size is None or config.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
    parse_tree(config.default_tree, "head.default_tree")


# ---- training ---------------------------------------------------------------------------------


def training_loss(model: DraftLayer, batch: dict) -> tuple[torch.Tensor, dict]:
    """Σ_j w_j · mean loss of unroll step j (step j drafts depth j+1; w_j = ttt_decay^j unless train.depth_weights
    says otherwise); metrics per step."""
    features = batch_features(batch, model.dtype)
    metrics = DepthMetrics(model.config.ttt_steps, features.device)
    sums, totals = [], []
    for step, out in enumerate(unroll(model, features, batch["input_ids"], batch.get("position_ids"))):
        loss_sum, correct, total = step_loss(model, out, features, batch, step)
        metrics.add(step, loss_sum, correct, total)
        sums.append(loss_sum)
        totals.append(total)
    own = [model.config.ttt_decay**step for step in range(len(sums))]
    weights = depth_weights(objective_of(model), own, metrics.correct, metrics.total)
    return per_depth_mean(weights, sums, totals), metrics.as_dict()


def set_objective(model: DraftLayer, objective: Objective) -> None:
    """Any train.loss; train.depth_weights over the ttt_steps unroll steps."""
    take_objective(model, objective, model.config.ttt_steps)


def unroll(model: DraftLayer, features: torch.Tensor, input_ids: torch.Tensor,
           position_ids: torch.Tensor | None = None):
    """Training-time test: yield the layer output [b, s-1, H] of each of `ttt_steps` steps.

    Step 0 reads the target's features; step j reads step j-1's outputs shifted by one
    position and attends, through one growing cache, to exactly the keys drafting depth j+1
    from anchor p - j would see (layers.ttt_visible). In training mode the input features
    get uniform noise U(-w/2, w/2).
    """
    config = model.config
    n = input_ids.shape[1] - 1  # position t reads x_{t+1}
    tokens = input_ids[:, 1:]
    segments = position_ids[:, :n] if position_ids is not None else None
    rope = segments if segments is not None else torch.arange(n, device=input_ids.device)[None]
    inputs = features[:, :n]
    if model.training and config.input_noise > 0:
        inputs = inputs + (torch.rand_like(inputs) - 0.5) * config.input_noise
    carry = model.initial_carry(inputs)
    cache = KVCache() if config.ttt_steps > 1 else None
    harmonised = config.ttt_mode == "harmonised"
    for step in range(config.ttt_steps):
        visible = ttt_visible(step, n, segments, input_ids.device)
        out = model.forward_layer(carry, tokens, rope, visible, cache)
        yield out
        carry = torch.cat([carry[:, :1], out[:, :-1]], dim=1)  # position p continues from p - 1's output
        if harmonised:  # HASS: later steps read what earlier ones drafted as given context, as drafting does
            carry = carry.detach()
            if cache is not None:
                cache.detach()


def step_loss(model: DraftLayer, out: torch.Tensor, features: torch.Tensor, batch: dict, step: int):
    """Loss of unroll step `step`: out[:, p] (anchor a = p - step) predicts f_{p+1} and x_{p+2}.

    Returns (loss_sum, top-1 hits, count) over the positions that got the token loss: all counted
    positions, or in training a random `token_loss_fraction` of them. The projection onto the
    vocabulary (three [m, H] x [H, V] products with the target's logits) is most of a step's cost
    on a CPU; a feature loss is cheap and averages over every counted position.
    """
    mask = shift_mask(batch, step + 2)  # [b, s - step - 2], indexed by the anchor
    span = mask.shape[1]
    rows = out[:, step : step + span][mask]  # [m, H]
    labels = batch["input_ids"][:, step + 2 :][mask]
    if labels.numel() == 0:
        return out.sum() * 0.0, 0, 0  # keeps every parameter in the graph (DDP)
    target_f = features[:, step + 1 : step + 1 + span, -model.hidden_size :][mask]  # f_{p+1}
    pick = token_loss_positions(model, labels.numel(), labels.device)
    logits = model.draft_logits(rows[pick])
    kind = objective_of(model).loss_for("kl")  # the head's own: soft CE against the target's distribution
    harmonised = model.config.ttt_mode == "harmonised"
    with torch.no_grad():
        target_log_p = None if kind == "ce" and not harmonised else \
            model.target_logits(target_f[pick]).float().log_softmax(-1)
    per_token = token_loss(kind, logits, target_log_p, model.vocab.labels(labels[pick]))
    if harmonised:
        per_token = per_token + top_k_distillation(logits, target_log_p)
    loss = model.position_loss(per_token, rows, target_f)
    guess = model.vocab.to_target(logits.argmax(-1))
    return loss.sum(), (guess == labels[pick]).sum(), guess.numel()


def top_k_distillation(logits: torch.Tensor, target_log_p: torch.Tensor, k: int = HASS_TOP_K) -> torch.Tensor:
    """[n] HASS's harmonised objective: -Σ p log q over the target's k most likely tokens, the ones a drafting tree
    offers, so the drafter ranks them as the target does rather than spreading its fit over the tail."""
    top = target_log_p.topk(min(k, target_log_p.shape[-1]), dim=-1)
    return -(top.values.exp() * logits.float().log_softmax(-1).gather(-1, top.indices)).sum(-1)


def token_loss_positions(model: DraftLayer, m: int, device) -> torch.Tensor | slice:
    """Which of m counted positions get the token loss: all of them, or in training a random share."""
    fraction = model.config.token_loss_fraction
    if not model.training or fraction >= 1:
        return slice(None)
    return torch.randperm(m, device=device)[: max(1, round(fraction * m))]


# ---- drafting ---------------------------------------------------------------------------------


class LayerDrafting:
    """The drafting state of one generation: the layer's KV cache, how much of it holds committed
    positions, and the layer's output at the last committed position with the pending token."""

    def __init__(self):
        self.cache = KVCache()
        self.committed = 0  # cached positions that belong to committed tokens
        self.root_out: torch.Tensor | None = None  # [b, H] layer output at the last committed position
        self.root_token: torch.Tensor | None = None  # [b] the pending token

    @torch.no_grad()
    def observe(self, model: DraftLayer, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, F], the token after each [b, n]."""
        self.cache.truncate(self.committed)
        n = next_tokens.shape[1]
        positions = torch.arange(self.committed, self.committed + n, device=next_tokens.device)[None]
        visible = causal_visible(None, 1, n, past=self.committed, device=next_tokens.device)
        carry = model.initial_carry(features.to(model.dtype))
        out = model.forward_layer(carry, next_tokens, positions, visible, self.cache)
        self.committed += n
        self.root_out, self.root_token = out[:, -1], next_tokens[:, -1]

    @torch.no_grad()
    def propose(self, model: DraftLayer, tree: Tree | DynamicTreeSpec, sampling: Sampling) -> Proposal:
        """Draft a static tree level by level, or an EAGLE-2 dynamic tree (one sequence)."""
        if self.root_out is None:
            raise ValueError("observe the prompt before calling propose")
        self.cache.truncate(self.committed)
        state = {"out": {0: self.root_out}, "columns": {}}
        expand = functools.partial(self._expand, model, state)
        if isinstance(tree, DynamicTreeSpec):
            tree, tokens, q = draft_dynamic(tree, self.root_token, expand, sampling, model.vocab)
        else:
            tree = tree.compacted() if sampling.sampled else tree  # sampled children: no gaps in sibling ranks
            tokens, q = draft_static(tree, self.root_token, expand, sampling, model.vocab)
        return Proposal(tree, tokens, q)

    def _expand(self, model: DraftLayer, state: dict, nodes: list[int], parents: list[int], tokens: torch.Tensor):
        """Feed tree `nodes` (one depth) through the layer; logits for their children [b, n, V or Vd]."""
        if nodes == [0]:
            return model.draft_logits(self.root_out)[:, None]
        past = len(self.cache)
        for i, node in enumerate(nodes):
            state["columns"][node] = past + i
        depths = [node_depth(parents, node) for node in nodes]
        # the root sits at the last committed position; a node of depth d at d positions later
        positions = torch.tensor(depths, device=tokens.device)[None] + self.committed - 1
        visible = tree_visible(nodes, parents, state["columns"], past + len(nodes), self.committed, tokens.device)
        carry = torch.stack([state["out"][parents[node]] for node in nodes], dim=1)
        out = model.forward_layer(carry, tokens[:, nodes], positions, visible, self.cache)
        for i, node in enumerate(nodes):
            state["out"][node] = out[:, i]
        return model.draft_logits(out)
