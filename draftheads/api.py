"""The public entry points; each delegates to the subpackage that owns the work."""

from __future__ import annotations

from draftheads.training.target import load_target

__all__ = ["load_target", "build_drafter", "load_drafter", "speculative_generate"]


def build_drafter(head_type: str, target, **cfg):
    """A new, untrained drafter of `head_type` ('medusa', 'eagle', 'mtp') wired to `target`.

    `cfg` holds head hyper-parameters (the recipe's `head:` keys); values derived from the target
    (layer ids, draft vocabulary) are filled in. The drafter is bound to the target's frozen
    shared modules and placed on the target's device and dtype.
    """
    from draftheads.config import build, suggest
    from draftheads.errors import DraftheadsError
    from draftheads.heads import HEAD_CONFIGS, HEAD_TYPES
    from draftheads.heads.common import place_like, target_dims

    if head_type not in HEAD_TYPES:
        raise DraftheadsError(f"unknown head type '{head_type}'{suggest(str(head_type), HEAD_TYPES)}; use one of {', '.join(HEAD_TYPES)}")
    config = build(HEAD_CONFIGS[head_type], {**cfg, "type": head_type}, "head")
    if hasattr(config, "resolve"):
        dims = target_dims(target.config)
        config.resolve(dims.num_layers, dims.vocab_size)
    drafter = HEAD_TYPES[head_type].from_target(target.config, config)
    return place_like(drafter.bind(target), target)


def load_drafter(path, target):
    """A trained drafter from `path` (a native drafter folder or a run folder), checked against and wired to `target`."""
    from draftheads.heads.native import load_drafter as load

    return load(path, target)


def speculative_generate(target, drafter, input_ids, **kwargs):
    """Generate with speculative decoding; see draftheads.inference.generate.speculative_generate.

    Returns a GenerationResult: .tokens [1, n] (prompt excluded), .stats (GenerationStats)."""
    from draftheads.inference.generate import speculative_generate as generate

    return generate(target, drafter, input_ids, **kwargs)
