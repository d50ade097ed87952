"""Training batches and drafting inputs for head tests, built from a tiny target."""

from __future__ import annotations

import torch

PROMPT = 4  # the first PROMPT tokens of every row are "prompt": loss_mask 0


def make_batch(target, feature_layers, b: int = 2, s: int = 16, seed: int = 0, pad: int = 3) -> dict:
    """A right-padded batch: row 1 has `pad` padding tokens; the first PROMPT tokens are not counted.

    features [b, s, F] are the target's hidden states at `feature_layers`, concatenated.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.config.vocab_size, (b, s), generator=g)
    attention = torch.ones(b, s, dtype=torch.long)
    if pad and b > 1:
        attention[1, s - pad:] = 0
    loss_mask = attention.clone()
    loss_mask[:, :PROMPT] = 0
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "features": target_features(target, ids, attention, feature_layers),
    }


def row_batch(ids: torch.Tensor, features: torch.Tensor, **extra) -> dict:
    """One unpadded batch of `ids` with their features, every token counted unless `extra` says otherwise."""
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": ones, "loss_mask": ones, "features": features, **extra}


def decisive_target(family: str = "qwen3"):
    """A tiny target whose greedy continuation is decided: its logits 8x those of the fixtures' targets.

    The fixtures' targets are nearly flat (entropy 5.2 nats of ln 384 = 5.95; top-2 gaps along a continuation down
    to 2e-4), so which of two near-tied tokens a soft-label fit ranks first is settled by float rounding, and differs
    between CPUs. Scaled, the smallest gap along continuation_batch's answer is 0.013 and 39 of its 40 exceed 0.05;
    the argmax, hence the continuation, is unchanged."""
    from tests.fixtures import make_target

    target = make_target(family)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(8.0)
    return target


def continuation_batch(target, feature_layers, prompt_len: int = 6, new_tokens: int = 40):
    """(prompt [1, p], answer [1, n], batch): the target's own greedy continuation of a random prompt, as one row
    whose answer tokens are counted, for tests that train a drafter on it and draft it back."""
    from draftheads.decoding.generate import speculative_generate

    prompt = torch.randint(0, 300, (1, prompt_len), generator=torch.Generator().manual_seed(4))
    answer = speculative_generate(target, None, prompt, new_tokens, eos_token_id=[]).tokens
    ids = torch.cat([prompt, answer], 1)
    loss_mask = torch.ones_like(ids)
    loss_mask[0, :prompt_len] = 0
    return prompt, answer, row_batch(ids, target_features(target, ids, None, feature_layers), loss_mask=loss_mask)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, attention: torch.Tensor | None, feature_layers) -> torch.Tensor:
    hidden = target(ids, attention_mask=attention, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in feature_layers], dim=-1)


def perturb(drafter: torch.nn.Module, seed: int = 1, scale: float = 0.05) -> None:
    """Move every floating parameter away from its (often zero) init, so tests see real weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.is_floating_point() and p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g).to(p.dtype) * scale)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def train_steps(drafter, batch: dict, steps: int = 20, lr: float = 3e-3) -> tuple[list[float], list[int]]:
    """AdamW steps on one batch; (loss per step, depth-1 top-1 hits per step)."""
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=lr)
    losses, hits = [], []
    for _ in range(steps):
        loss, metrics = drafter.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        hits.append(metrics["correct"][0].item())
    return losses, hits
