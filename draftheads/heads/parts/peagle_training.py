"""Training P-EAGLE: every depth in one pass, each slot seeing exactly what it sees when drafted.

Position p of a row holds EAGLE-3's input (the target's fused features f_p and the token x_{p+1}) and predicts
x_{p+2}: depth 0. The depth-d slot of anchor a (d >= 1) holds the mask hidden vector and the mask token at position
a + d and predicts x_{a+d+2}; when drafted it sees the committed positions up to a (in its own packed sample) and the
slots 1..d of its own anchor, never another anchor's. Depth 0 runs first, causal, into the layer's cache; then every
slot of every depth in one call over that cache.

COD subsampling (as the P-EAGLE paper and speculators do): depth d keeps a share max(cod_ratio^d, cod_min) of the
anchors, drawn among those depth d - 1 kept, so every kept slot's chain of earlier slots is there to attend to. Loss:
the recipe's token loss (by default soft cross-entropy against the target's distribution restricted to the draft
vocabulary, EAGLE-3's), a mean over every trained position weighted depth_decay^d (or train.depth_weights). With a
Markov head, the slot predicting x_{a+d+2} adds the bias of the real token before it, x_{a+d+1} (teacher forcing, as
DSpark trains it).
"""

from __future__ import annotations

import torch

from draftheads.heads.parts.common import DepthMetrics, batch_features, shift_mask
from draftheads.heads.parts.layers import KVCache, causal_visible
from draftheads.heads.parts.objective import (Objective, depth_weights, objective_of, pooled_mean, take_objective,
                                              token_loss)

EVAL_SEED = 0  # slots drawn in eval mode: the same every call, so held-out figures compare


def parallel_training_loss(model, batch: dict) -> tuple[torch.Tensor, dict]:
    """Σ_d decay^d · loss sum at depth d / Σ_d decay^d · count at depth d, and per-depth metrics."""
    features = batch_features(batch, model.dtype)
    depth0, slots = parallel_forward(model, batch, features)
    counted0 = shift_mask(batch, 2)  # [b, n - 1]: x_{p+2} counts
    rows0 = torch.nonzero(counted0, as_tuple=True)
    outputs = [(depth0[:, :-1][counted0], rows0[0], rows0[1], 0)]
    if slots is not None:
        anchor, depth, valid, out = slots
        for d in range(1, model.config.depths):
            keep = valid & (depth == d)
            rows, index = torch.nonzero(keep, as_tuple=True)
            outputs.append((out[keep], rows, anchor[rows, index], d))
    return depth_losses(model, features, batch["input_ids"], outputs)


def parallel_forward(model, batch: dict, features: torch.Tensor):
    """(depth-0 outputs [b, n, H], slots): slots = (anchor, depth, valid [b, S], outputs [b, S, H]) of the COD-drawn
    mask slots, None when the drafter drafts one depth."""
    input_ids = batch["input_ids"]
    b, n = input_ids.shape[0], input_ids.shape[1] - 1  # position t reads x_{t+1}
    segments = batch["position_ids"][:, :n] if batch.get("position_ids") is not None else None
    rope = segments if segments is not None else torch.arange(n, device=input_ids.device)[None].expand(b, -1)
    inputs = features[:, :n]
    if model.training and model.config.input_noise > 0:
        inputs = inputs + (torch.rand_like(inputs) - 0.5) * model.config.input_noise
    cache = KVCache()
    depth0 = model.forward_layer(model.initial_carry(inputs), input_ids[:, 1:], rope,
                                 causal_visible(segments, b, n, device=input_ids.device), cache)
    if model.config.depths == 1:
        return depth0, None
    anchor, depth, valid = cod_slots(batch, model.config, model.training)
    carry, tokens = model.mask_slots(b, anchor.shape[1], input_ids.device)
    positions = rope.gather(1, anchor) + depth
    out = model.forward_layer(carry, tokens, positions, slot_visible(anchor, depth, valid, segments, n), cache)
    return depth0, (anchor, depth, valid, out)


def depth_losses(model, features, input_ids, outputs) -> tuple[torch.Tensor, dict]:
    """outputs: (layer outputs [m, H], their rows [m], anchors [m], depth) per depth -> the weighted mean loss."""
    depths = model.config.depths
    metrics = DepthMetrics(depths, features.device)
    objective = objective_of(model)
    kind = objective.loss_for("kl")  # the head's own: soft CE against the target's distribution
    sums = [model.mask_hidden.sum() * 0.0] * depths  # an empty depth keeps every parameter in the graph (DDP)
    totals = [0] * depths
    for out, rows, anchor, d in outputs:
        if out.shape[0] == 0:
            continue
        labels = input_ids[rows, anchor + d + 2]
        logits = model.markov_logits(model.draft_logits(out), input_ids[rows, anchor + d + 1])
        with torch.no_grad():  # the target predicts x_{a+d+2} from its last hidden state at a + d + 1
            target_log_p = None if kind == "ce" else model.target_logits(
                features[rows, anchor + d + 1, -model.hidden_size:]).float().log_softmax(-1)
        sums[d] = sums[d] + token_loss(kind, logits, target_log_p, model.vocab.labels(labels)).sum()
        totals[d] = labels.numel()
        guess = model.vocab.to_target(logits.argmax(-1))
        metrics.add(d, sums[d], (guess == labels).sum(), labels.numel())
    own = [model.config.depth_decay**d for d in range(depths)]
    weights = depth_weights(objective, own, metrics.correct, metrics.total)
    return pooled_mean(weights, sums, totals), metrics.as_dict()


def parallel_set_objective(model, objective: Objective) -> None:
    """Any train.loss; train.depth_weights over the `depths` depths."""
    take_objective(model, objective, model.config.depths)


def cod_slots(batch: dict, config, training: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(anchor, depth, valid) [b, S]: the mask slots trained this step, depth by depth (1..depths-1).

    Depth d may use anchor a when x_{a+d+2} counts (in a's packed sample) and depth d - 1 used a; it keeps the
    share max(cod_ratio^d, cod_min) of the row length, the anchors with the highest random scores (one score per
    anchor for all depths). Rows with fewer usable anchors fill the rest with invalid slots."""
    input_ids = batch["input_ids"]
    b, n = input_ids.shape[0], input_ids.shape[1] - 1
    generator = None if training else torch.Generator(device=input_ids.device).manual_seed(EVAL_SEED)
    scores = torch.rand((b, n), generator=generator, device=input_ids.device)
    usable = shift_mask(batch, 2)[:, :n]  # depth 0's counted anchors
    usable = torch.nn.functional.pad(usable, (0, n - usable.shape[1]))
    reference = max(int(usable.sum(-1).max()), 1)
    anchors, depths, valids = [], [], []
    for d in range(1, config.depths):
        label_counts = shift_mask(batch, d + 2)  # [b, s - d - 2]
        usable = usable & torch.nn.functional.pad(label_counts, (0, n - label_counts.shape[1]))
        count = min(n, max(1, round(reference * max(config.cod_ratio**d, config.cod_min))))
        top, index = scores.masked_fill(~usable, -1.0).topk(count, dim=-1)
        valid = top >= 0
        anchors.append(index.masked_fill(~valid, 0))
        depths.append(torch.full_like(index, d))
        valids.append(valid)
        usable = torch.zeros_like(usable).scatter(1, index, valid)
    return torch.cat(anchors, 1), torch.cat(depths, 1), torch.cat(valids, 1)


def slot_visible(anchor: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor, segments: torch.Tensor | None,
                 n: int) -> torch.Tensor:
    """[b, S, n + S] bool: slot (a, d) sees positions <= a of a's sample and the slots (a, d') with d' <= d; an
    invalid slot sees only itself (no query row is empty)."""
    keys = torch.arange(n, device=anchor.device)
    context = (keys[None, None] <= anchor[..., None]) & valid[..., None]  # [b, S, n]
    if segments is not None:
        segment = (segments == 0).cumsum(-1)  # [b, n]: which packed sample a position is in
        context &= segment[:, None, :] == segment.gather(1, anchor)[..., None]
    chain = (anchor[:, :, None] == anchor[:, None, :]) & (depth[:, None, :] <= depth[:, :, None])
    chain &= valid[:, :, None] & valid[:, None, :]
    chain |= torch.eye(anchor.shape[1], dtype=torch.bool, device=anchor.device)[None]
    return torch.cat([context, chain], dim=-1)
