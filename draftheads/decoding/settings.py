"""How one generation samples and stops, checked here and nowhere else: `speculative_generate` builds these
settings, and `draftheads eval` (evaluation/eval_config.py) checks its sampling settings with the same functions."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import warp_probs
from draftheads.decoding.accept import check_rule


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Temperature, top-k and top-p as plain sampling takes them."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise DraftheadsError(f"temperature {temperature!r} is not a finite number >= 0; give e.g. 0 (greedy) or 0.7")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise DraftheadsError(f"top_k {top_k!r} is not a whole number >= 0; give 0 (off) or e.g. 50")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise DraftheadsError(f"top_p {top_p!r} is not in (0, 1]; give 1 (off) or e.g. 0.9")


def check_typical(epsilon: float, delta: float, prefix: str = "") -> None:
    """Typical acceptance's thresholds: at 1 or above nothing but a certain token could be accepted. `prefix` names
    where the settings came from (e.g. 'eval.')."""
    for name, value, default in (("typical_epsilon", epsilon, 0.09), ("typical_delta", delta, 0.3)):
        if not 0 < value < 1:
            raise DraftheadsError(f"{prefix}{name} must be in (0, 1), got {value}; the default is {default}")


def check_new_tokens(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DraftheadsError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")


@dataclass(frozen=True)
class DecodeSettings:
    """One generation's acceptance rule, sampling warp, length and stop tokens."""

    rule: str = "greedy"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    eos: frozenset = frozenset()
    epsilon: float = 0.09
    delta: float = 0.3

    def __post_init__(self):
        check_rule(self.rule)
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_new_tokens(self.max_new_tokens)
        check_typical(self.epsilon, self.delta)
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("epsilon", float),
                           ("delta", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))   # numpy or int values as the loop compares them

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """What the acceptance rule reads as p. Greedy reads only the argmax, which temperature, top-k and
        top-p all keep: it gets the logits as they are (warping [N, V] for it would add to every verify step)."""
        if self.rule == "greedy":
            return logits
        return warp_probs(logits, self.temperature, self.top_k, self.top_p)


def decode_settings(target, rule, temperature, top_k, top_p, max_new_tokens, eos_token_id, epsilon,
                    delta) -> DecodeSettings:
    """The settings a generation runs with: checked, with the target's stop tokens."""
    settings = DecodeSettings(rule, temperature, top_k, top_p, max_new_tokens, eos_ids(target, eos_token_id), epsilon,
                              delta)
    # At T = 0 the warped target is a one-hot on its argmax, and strict and typical acceptance accept exactly the
    # children greedy does and emit its argmax: run the greedy rule, which skips warping [nodes, V] and the
    # rule's per-node work, several times cheaper.
    if settings.temperature == 0:
        settings = dataclasses.replace(settings, rule="greedy")
    return settings


def eos_ids(target, eos_token_id) -> frozenset:
    """The ids that end generation: given ones, else the target's generation_config, else its config."""
    if eos_token_id is None:
        generation_config = getattr(target, "generation_config", None)
        eos_token_id = getattr(generation_config, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(target.config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(i) for i in eos_token_id)
