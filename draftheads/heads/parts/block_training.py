"""Training a block-parallel drafter: many blocks of one row in one forward, each seeing only what it would see when
drafted.

A block is anchored at a position a of a row: slot 0 holds x_a (at drafting time the pending token, not yet fed to
the target), slots 1..B-1 the mask token, at positions a..a+B-1; slot k predicts x_{a+k}. At drafting time the
target's features are known up to a - 1, so the block attends to the context strictly before a (and within its own
packed sample) and to itself, bidirectionally; never to another block. Anchors are drawn at random among positions
whose next token counts (up to `anchors` per row, anew each step; a fixed draw when not training, so held-out
figures compare between evaluations). Slot 0 is never a loss position (its token is given).
"""

from __future__ import annotations

import torch

from draftheads.heads.parts.common import DepthMetrics
from draftheads.heads.parts.objective import depth_weights, objective_of, pooled_mean, token_loss

EVAL_SEED = 0  # anchors drawn in eval mode: the same every call


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B - 1] loss weight of slots 1..B-1: exp(-(k - 1) / gamma), later slots count less (their drafts are
    accepted only when every earlier one is)."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def row_positions(batch: dict) -> torch.Tensor:
    """[b, s] position of each token in its own sample (packed rows restart at 0)."""
    positions = batch.get("position_ids")
    if positions is not None:
        return positions
    b, s = batch["input_ids"].shape
    return torch.arange(s, device=batch["input_ids"].device)[None].expand(b, -1)


def anchor_candidates(batch: dict) -> torch.Tensor:
    """[b, s] bool: a block may be anchored at a (some context before a in its sample; x_{a+1} a counted token)."""
    attention = batch["attention_mask"].bool()
    counted = batch.get("loss_mask", batch["attention_mask"]).bool()
    positions = row_positions(batch)
    ok = torch.zeros_like(attention)
    ok[:, :-1] = attention[:, :-1] & attention[:, 1:] & counted[:, 1:] & (positions[:, 1:] - positions[:, :-1] == 1)
    return ok & (positions >= 1)


def sample_anchors(batch: dict, anchors: int, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor [b, A], valid [b, A]): up to `anchors` distinct candidate positions per row, in increasing order;
    rows with fewer candidates fill the rest with invalid anchors (at 0)."""
    ok = anchor_candidates(batch)
    generator = None if training else torch.Generator(device=ok.device).manual_seed(EVAL_SEED)
    scores = torch.rand(ok.shape, generator=generator, device=ok.device).masked_fill(~ok, -1.0)
    count = min(anchors, ok.shape[1])
    top, index = scores.topk(count, dim=-1)
    valid = top >= 0
    index = index.masked_fill(~valid, 0)
    order = torch.where(valid, index, ok.shape[1]).argsort(dim=-1)  # valid anchors first, by position
    return index.gather(1, order), valid.gather(1, order)


def block_inputs(batch: dict, anchor: torch.Tensor, block_size: int, mask_token_id: int):
    """(tokens [b, A, B], positions [b, A, B]): x_a then mask tokens, at a's position onwards."""
    first = batch["input_ids"].gather(1, anchor)
    tokens = torch.full((*anchor.shape, block_size), mask_token_id, dtype=torch.long, device=anchor.device)
    tokens[..., 0] = first
    start = row_positions(batch).gather(1, anchor)
    return tokens, start[..., None] + torch.arange(block_size, device=anchor.device)


def block_visible(batch: dict, anchor: torch.Tensor, valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, A * B, s + A * B] bool: a block's queries see the context before its anchor, within the anchor's sample,
    and every slot of their own block (an invalid block sees only itself, so no query row is empty)."""
    b, s = batch["input_ids"].shape
    count = anchor.shape[1]
    attention = batch["attention_mask"].bool()
    segment = (row_positions(batch) == 0).cumsum(-1)  # [b, s]: which packed sample a position is in
    keys = torch.arange(s, device=anchor.device)
    context = (keys[None, None] < anchor[..., None]) & attention[:, None]  # [b, A, s]
    context &= segment[:, None, :] == segment.gather(1, anchor)[..., None]
    context &= valid[..., None]
    own = torch.eye(count, dtype=torch.bool, device=anchor.device)[None].expand(b, -1, -1)  # [b, A, A]
    own = own.repeat_interleave(block_size, dim=2)  # [b, A, A * B]
    visible = torch.cat([context, own], dim=-1)  # [b, A, s + A * B]
    return visible.repeat_interleave(block_size, dim=1)


def block_labels(batch: dict, anchor: torch.Tensor, valid: torch.Tensor, block_size: int):
    """(labels [b, A, B], counted [b, A, B]): x_{a+k} and whether slot k's prediction counts (k >= 1, inside the
    row and the anchor's sample, a counted token)."""
    b, s = batch["input_ids"].shape
    where = anchor[..., None] + torch.arange(block_size, device=anchor.device)  # [b, A, B]
    inside = where < s
    where = where.clamp(max=s - 1)
    flat = where.reshape(b, -1)
    labels = batch["input_ids"].gather(1, flat).view_as(where)
    attention = batch["attention_mask"].bool().gather(1, flat).view_as(where)
    counted = batch.get("loss_mask", batch["attention_mask"]).bool().gather(1, flat).view_as(where)
    positions = row_positions(batch)
    steps = positions.gather(1, flat).view_as(where) - positions.gather(1, anchor)[..., None]
    ok = inside & attention & counted & valid[..., None] & (steps == torch.arange(block_size, device=anchor.device))
    ok[..., 0] = False
    return labels, ok


def block_loss(model, out: torch.Tensor, anchor: torch.Tensor, labels: torch.Tensor,
               counted: torch.Tensor, final_features: torch.Tensor | None):
    """Σ_k w_k · loss at slot k / Σ_k w_k · count at slot k (a weighted mean over every counted slot), and per-slot
    metrics. out [b, A, B, H] is the drafter's output; with `final_features` (the target's last hidden state
    [b, s, H]) the default loss is cross-entropy against the target's distribution of x_{a+k} (KD), else against
    x_{a+k}; train.loss (which needs those features, unless ce) and train.depth_weights replace them."""
    block_size = out.shape[2]
    objective = objective_of(model)
    kind = objective.loss_for("kl" if final_features is not None else "ce")
    metrics = DepthMetrics(block_size - 1, out.device)
    sums = [out.sum() * 0.0] * (block_size - 1)  # an empty slot keeps every parameter in the graph (DDP)
    totals = [0] * (block_size - 1)
    for k in range(1, block_size):
        mask = counted[:, :, k]
        total = int(mask.sum())
        if total == 0:
            continue
        logits = model.draft_logits(out[:, :, k][mask])
        target = labels[:, :, k][mask]
        target_log_p = None
        if kind != "ce":
            rows, blocks = torch.nonzero(mask, as_tuple=True)
            before = anchor[rows, blocks] + k - 1  # the target predicts x_{a+k} from its feature at a+k-1
            with torch.no_grad():
                target_log_p = model.target_logits(final_features[rows, before]).float().log_softmax(-1)
        sums[k - 1] = sums[k - 1] + token_loss(kind, logits, target_log_p, model.vocab.labels(target)).sum()
        totals[k - 1] = total
        guess = model.vocab.to_target(logits.argmax(-1))
        metrics.add(k - 1, sums[k - 1], (guess == target).sum(), total)
    own = slot_weights(block_size, model.config.gamma).tolist()
    weights = depth_weights(objective, own, metrics.correct, metrics.total)
    return pooled_mean(weights, sums, totals), metrics.as_dict()
