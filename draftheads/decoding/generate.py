"""Speculative decoding as a function: `generate(target, drafter, input_ids, settings)`, with its settings one
`DecodeSettings` (decoding/settings.py), and `speculative_generate(target, drafter, input_ids, ...)`, the public API's
form of it, with the settings as keywords.

It checks what it is given (prompts, the tree, that the drafter fits the target; the settings checked themselves),
then runs the one generation loop (decoding/decoder.py) over one prompt or a batch of them: plain
decoding when drafter is None, speculative decoding otherwise, with the same statistics for both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draftheads.core.drafter import Drafter, TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.tree import AutoTreeSpec, DynamicTreeSpec, Tree, parse_tree
from draftheads.decoding.decoder import Decoder
from draftheads.decoding.settings import DecodeSettings
from draftheads.decoding.stats import GenerationStats
from draftheads.decoding.recurrent_state import check_recurrent_target


@dataclass
class GenerationResult:
    """tokens: [b, n] generated ids (prompt excluded, EOS included when reached), rows shorter than the longest
    padded with -1; rows: each row's ids; stats: every row's GenerationStats merged; row_stats: each row's."""

    tokens: torch.Tensor
    stats: GenerationStats
    rows: list[list[int]] = field(default_factory=list)
    row_stats: list[GenerationStats] = field(default_factory=list)


def speculative_generate(
    target,
    drafter: Drafter | None,
    input_ids,
    max_new_tokens: int = DecodeSettings.max_new_tokens,
    *,
    tree=None,
    accept: str = DecodeSettings.rule,
    temperature: float = DecodeSettings.temperature,
    top_p: float = DecodeSettings.top_p,
    top_k: int = DecodeSettings.top_k,
    seed: int | list[int] = 0,
    eos_token_id: int | list[int] | None = DecodeSettings.eos_token_id,
    typical_epsilon: float = DecodeSettings.typical_epsilon,
    typical_delta: float = DecodeSettings.typical_delta,
    plain_above: int | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` after each prompt with the target, drafting with `drafter`: `generate` with
    its settings given as keywords (the defaults are DecodeSettings').

    input_ids: one prompt ([s] or [1, s]), a batch of equally long ones [b, s], or a list of prompts of any
    lengths (decoded together, left-padded). seed: one per prompt, or one for all (row r then gets seed + r).
    tree: None (the drafter's default), 'chain:K', 'dynamic:TOPK,DEPTH,TOTAL', index paths or a Tree.
    accept: 'greedy', 'strict' (lossless sampling) or 'typical' (Medusa's typical acceptance).
    temperature / top_k / top_p: warp the target distribution exactly as plain sampling does (T=0: greedy).
    eos_token_id: None = the target's generation_config / config EOS ids; [] = never stop early.
    plain_above: while more than this many prompts are still generating, decode plainly (speculation
    stops paying at some batch size: `draftheads eval --batch-size` finds where).
    drafter=None gives plain decoding through the same loop (baseline timings).
    """
    settings = DecodeSettings(accept, temperature, top_k, top_p, max_new_tokens, typical_epsilon, typical_delta,
                              eos_token_id)
    spec = parse_tree(tree) if drafter is not None else None   # plain decoding drafts no tree
    return generate(target, drafter, input_ids, settings, tree=spec, seed=seed, plain_above=plain_above)


def generate(target, drafter: Drafter | None, input_ids, settings: DecodeSettings, *,
             tree: Tree | DynamicTreeSpec | None = None, seed: int | list[int] = 0,
             plain_above: int | None = None) -> GenerationResult:
    """Generate after each prompt with `settings` (checked when they were built), drafting `tree` (a parsed spec;
    None: the drafter's default) with `drafter`; input_ids, seed and plain_above as `speculative_generate` takes
    them."""
    t0 = time.perf_counter()
    prompts = check_inputs(target, input_ids)
    spec = resolve_tree(drafter, tree)
    if drafter is not None:
        check_drafter_fits(drafter, target)
    check_recurrent_target(target, spec, len(prompts))
    seeds = seed if isinstance(seed, (list, tuple)) else [seed + r for r in range(len(prompts))]
    if len(seeds) != len(prompts):
        raise DraftheadsError(f"give one seed per prompt: {len(seeds)} seeds for {len(prompts)} prompts")
    generators = [torch.Generator(device=prompts[0].device).manual_seed(int(s)) for s in seeds]
    decoder = Decoder(target, drafter, spec, settings, generators, plain_above=plain_above)
    decoder.start(prompts)
    while not decoder.done:
        decoder.step()
    total = time.perf_counter() - t0
    for row in decoder.rows:
        row.stats.prompts += 1
        row.stats.new_tokens += len(row.generated)
        row.stats.total_s += total / len(decoder.rows)
    width = max(len(row.generated) for row in decoder.rows)
    tokens = torch.tensor([row.generated + [-1] * (width - len(row.generated)) for row in decoder.rows],
                          dtype=torch.long, device=prompts[0].device)
    return GenerationResult(tokens, GenerationStats.merged(row.stats for row in decoder.rows),
                            [row.generated for row in decoder.rows], [row.stats for row in decoder.rows])


def check_inputs(target, input_ids) -> list[torch.Tensor]:
    """One prompt ([s] or [1, s]), a batch [b, s], or a list of prompts -> one LongTensor [s_i] per prompt, on the
    target's device."""
    if isinstance(input_ids, (list, tuple)) and input_ids and not isinstance(input_ids[0], int):
        prompts = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in input_ids]
    else:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        ids = ids[None] if ids.dim() == 1 else ids
        if ids.dim() != 2:
            raise DraftheadsError(f"input_ids must be [s], [b, s] or a list of prompts, got shape {tuple(ids.shape)}")
        prompts = list(ids)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DraftheadsError("input_ids must hold at least one non-empty prompt of token ids")
    attention = getattr(target.config, "_attn_implementation", None) or "sdpa"
    if "flash" in attention or "flex" in attention:
        raise DraftheadsError(f"tree verification needs a 4D additive mask, which {attention} attention does not take; "
                              "load the target with attn_implementation='sdpa' (or 'eager')")
    vocab = target_dims(target.config).vocab_size
    for p in prompts:
        if int(p.min()) < 0 or int(p.max()) >= vocab:
            bad = int(p.max()) if int(p.max()) >= vocab else int(p.min())
            raise DraftheadsError(f"input_ids hold token id {bad}, outside the target's vocabulary of {vocab}; "
                                  "tokenize the prompt with the target's own tokenizer")
    return [p.to(target.device) for p in prompts]


def check_drafter_fits(drafter, target) -> None:
    """A learned drafter must have been built for a target of this hidden size and vocabulary."""
    if not isinstance(drafter, TrainableDrafter):
        return  # prompt lookup, and drafters of the caller's own: nothing to compare
    dims = target_dims(target.config)
    if (drafter.hidden_size, drafter.vocab_size) != (dims.hidden_size, dims.vocab_size):
        raise DraftheadsError(f"this drafter was built for a target with hidden size {drafter.hidden_size} and "
                              f"vocabulary {drafter.vocab_size}, but this target has {dims.hidden_size} and "
                              f"{dims.vocab_size}; use the target it was trained on")


def resolve_tree(drafter, tree) -> Tree | DynamicTreeSpec | None:
    """The tree spec to draft: the given one (parsed), or the drafter's default; None without a drafter."""
    if drafter is None:
        return None
    if not isinstance(drafter, Drafter):
        raise DraftheadsError(f"{type(drafter).__name__} is not a drafter (needs feature_layers, default_tree, reset, "
                              "observe, propose)")
    spec = tree if tree is not None else drafter.default_tree
    if isinstance(spec, AutoTreeSpec):
        raise DraftheadsError("an auto tree is fitted to a drafter by draftheads eval; give chain:K, static:PATHS or "
                              "dynamic:TOPK,DEPTH,TOTAL")
    if isinstance(spec, Tree) and spec.num_nodes == 1:
        raise DraftheadsError("the draft tree has no draft nodes; give chain:K with K >= 1 or some index paths")
    return spec
