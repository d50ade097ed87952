"""The sizes of a target read from its transformers config, without loading weights: what heads are built
for, what drafter folders record and what the generation loop checks a drafter against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetDims:
    hidden_size: int
    vocab_size: int
    num_layers: int


def text_config(target_config):
    """The language-model part of a (possibly multimodal) transformers config."""
    return target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config


def target_dims(target_config) -> TargetDims:
    text = text_config(target_config)
    return TargetDims(text.hidden_size, text.vocab_size, text.num_hidden_layers)


def context_limit(model) -> int:
    """The target's context length in tokens (unbounded when its config names none)."""
    text = model.config.get_text_config(decoder=True)
    return int(getattr(text, "max_position_embeddings", None) or 1 << 20)
