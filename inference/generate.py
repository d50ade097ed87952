"""The one generation loop: plain decoding when drafter is None, speculative decoding otherwise.

State between steps: the target's KV cache holds every committed token except the newest one,
the pending token (already emitted, not yet fed to the target). Each step:

    proposal = drafter.propose(tree)            # a tree rooted at the pending token
    logits   = target(proposal.tokens | cache, tree mask, positions prefix + depth)   # one forward
    path, y  = acceptance rule(p = warp(logits), q = proposal.q)
    emit the accepted drafts and y (stopping at EOS / max_new_tokens exactly like plain decoding)
    compact the cache to prefix + path; drafter.observe(features at path, tokens following them)

With drafter=None the tree is the root alone: one forward per token, i.e. plain decoding, and
the same statistics give the baseline timings.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.drafter import Drafter, Proposal, TrainableDrafter
from draftheads.core.sampling import sample, top1, warp_probs
from draftheads.core.tree import AutoTreeSpec, DynamicTreeSpec, Tree, parse_tree
from draftheads.heads.common import target_dims
from draftheads.inference.accept import accept, check_rule
from draftheads.inference.stats import GenerationStats
from draftheads.inference.verify import check_length, compact_cache, new_cache, prefill, verify

ROOT_ONLY = Tree.from_paths([])


@dataclass
class GenerationResult:
    """tokens: [b, n] generated ids (prompt excluded, EOS included when reached). stats: see GenerationStats."""

    tokens: torch.Tensor
    stats: GenerationStats


@dataclass(frozen=True)
class DecodeSettings:
    """How one generation samples and stops (validated by `decode_settings`)."""

    rule: str = "greedy"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    eos: frozenset = frozenset()
    epsilon: float = 0.09
    delta: float = 0.3

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """What the acceptance rule reads as p. Greedy reads only the argmax, which temperature, top-k and
        top-p all keep: it gets the logits as they are (warping [N, V] for it cost ~6% of a verify step)."""
        if self.rule == "greedy":
            return logits
        return warp_probs(logits, self.temperature, self.top_k, self.top_p)


def clock(device: torch.device) -> float:
    """Wall time, after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Decoder:
    """One generation in progress: `start(input_ids)`, then `step()` until `done`."""

    def __init__(self, target, drafter: Drafter | None, tree: Tree | DynamicTreeSpec | None, settings: DecodeSettings,
                 generator: torch.Generator):
        self.target, self.drafter, self.settings, self.generator = target, drafter, settings, generator
        self.tree = ROOT_ONLY if drafter is None else tree
        self.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        self.stats = GenerationStats()
        self.generated: list[int] = []
        self.done = False
        self.cache = None
        self.pending: torch.Tensor | None = None   # [b]

    def start(self, input_ids: torch.Tensor) -> None:
        """Prefill the prompt [b, s], emit the first token, show the drafter the prompt."""
        device = input_ids.device
        t0 = clock(device)
        self.cache = new_cache(self.target)
        out = prefill(self.target, input_ids, self.cache, self.feature_layers)
        p = self.settings.warp(out.logits[:, -1])
        first = top1(p) if self.settings.rule == "greedy" else sample(p, self.generator)
        self._emit([int(first[0])])
        t1 = clock(device)
        self.stats.prefill_s += t1 - t0
        self.stats.prompt_tokens += input_ids.shape[1]
        self.pending = first
        if self.drafter is not None and not self.done:
            self.drafter.reset()
            self.drafter.observe(self._features(out.features, input_ids.shape[1]), torch.cat([input_ids[:, 1:], first[:, None]], 1))
            self.stats.draft_prefill_s += clock(device) - t1

    def step(self) -> list[int]:
        """One draft + verify round; returns the tokens it emitted."""
        device = self.pending.device
        t0 = clock(device)
        proposal = self._propose()
        t1 = clock(device)
        tree = proposal.tree
        out = verify(self.target, self.cache, proposal.tokens, tree, self.feature_layers)
        s = self.settings
        result = accept(s.rule, tree, proposal.tokens, s.warp(out.logits), proposal.q, self.generator,
                        epsilon=s.epsilon, delta=s.delta)
        path = result.path[0, : int(result.num_accepted[0]) + 1]
        new_tokens = torch.cat([proposal.tokens[0, path[1:]], result.next_token[:1]])
        emitted = self._emit(new_tokens.tolist())
        if not self.done:
            compact_cache(self.cache, tree.num_nodes, path)
        t2 = clock(device)
        if not self.done and self.drafter is not None:
            self.drafter.observe(self._features(out.features, len(path), path), new_tokens[None])
        self.pending = result.next_token[:1]
        t3 = clock(device)
        draft_s = (t1 - t0) + (t3 - t2) if self.drafter is not None else 0.0   # plain decoding: all of it is the step
        self.stats.record_step(tree, path.tolist(), len(emitted), draft_s=draft_s, verify_s=t3 - t0 - draft_s)
        return emitted

    def _propose(self) -> Proposal:
        if self.drafter is None:
            return Proposal(ROOT_ONLY, self.pending[:, None])
        s = self.settings
        proposal = self.drafter.propose(self.tree, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                        generator=self.generator)
        tokens = proposal.tokens
        if tokens.dim() != 2 or tokens.shape[1] != proposal.tree.num_nodes or not torch.equal(tokens[:, 0], self.pending):
            raise RuntimeError(
                f"{type(self.drafter).__name__}.propose returned tokens {tuple(tokens.shape)} for a "
                f"{proposal.tree.num_nodes}-node tree; column 0 must be the pending token"
            )
        return proposal

    def _features(self, features: torch.Tensor | None, n: int, index: torch.Tensor | None = None) -> torch.Tensor:
        """Features of the committed positions [b, n, F] (F = 0 when the drafter reads none)."""
        if features is None:
            return torch.empty(self.pending.shape[0], n, 0, device=self.pending.device)
        return features if index is None else features[:, index]

    def _emit(self, tokens: list[int]) -> list[int]:
        """Append tokens one by one as plain decoding would: stop after an EOS or at max_new_tokens."""
        emitted = []
        for token in tokens:
            emitted.append(token)
            if token in self.settings.eos or len(self.generated) + len(emitted) >= self.settings.max_new_tokens:
                self.done = True
                break
        self.generated += emitted
        return emitted

    def result(self) -> GenerationResult:
        self.stats.prompts += 1
        self.stats.new_tokens += len(self.generated)
        tokens = torch.tensor([self.generated], dtype=torch.long, device=self.pending.device)
        return GenerationResult(tokens, self.stats)


def speculative_generate(
    target,
    drafter: Drafter | None,
    input_ids,
    max_new_tokens: int = 128,
    *,
    tree=None,
    accept: str = "greedy",
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    eos_token_id: int | list[int] | None = None,
    typical_epsilon: float = 0.09,
    typical_delta: float = 0.3,
) -> GenerationResult:
    """Generate up to `max_new_tokens` after `input_ids` ([1, s] or [s]) with the target, drafting with `drafter`.

    tree: None (the drafter's default), 'chain:K', 'dynamic:TOPK,DEPTH,TOTAL', index paths or a Tree.
    accept: 'greedy', 'strict' (lossless sampling) or 'typical' (Medusa's typical acceptance).
    temperature / top_k / top_p: warp the target distribution exactly as plain sampling does (T=0: greedy).
    eos_token_id: None = the target's generation_config / config EOS ids; [] = never stop early.
    drafter=None gives plain decoding through the same loop (baseline timings).
    """
    t0 = time.perf_counter()
    input_ids = check_inputs(target, input_ids)
    settings = decode_settings(target, accept, temperature, top_k, top_p, max_new_tokens, eos_token_id,
                               typical_epsilon, typical_delta)
    spec = resolve_tree(drafter, tree)
    if drafter is not None:
        check_drafter_fits(drafter, target)
    check_length(target, input_ids.shape[1] + max_new_tokens + (1 if spec is None else spec.num_nodes))
    generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    decoder = Decoder(target, drafter, spec, settings, generator)
    decoder.start(input_ids)
    while not decoder.done:
        decoder.step()
    result = decoder.result()
    result.stats.total_s += time.perf_counter() - t0
    return result


def check_inputs(target, input_ids) -> torch.Tensor:
    """[s] or [1, s] ids (tensor or list) -> LongTensor [1, s] on the target's device."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise DraftheadsError(f"input_ids must be a non-empty [1, s] sequence of token ids, got shape {tuple(ids.shape)}")
    attention = getattr(target.config, "_attn_implementation", None) or "sdpa"
    if "flash" in attention or "flex" in attention:
        raise DraftheadsError(f"tree verification needs a 4D additive mask, which {attention} attention does not take; "
                              "load the target with attn_implementation='sdpa' (or 'eager')")
    if ids.shape[0] != 1:
        raise DraftheadsError(f"speculative_generate takes one prompt at a time (batch 1), got batch {ids.shape[0]}; loop over prompts")
    vocab = target_dims(target.config).vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        raise DraftheadsError(f"input_ids hold token id {bad}, outside the target's vocabulary of {vocab}; "
                              "tokenize the prompt with the target's own tokenizer")
    return ids.to(target.device)


def decode_settings(target, rule, temperature, top_k, top_p, max_new_tokens, eos_token_id, epsilon, delta) -> DecodeSettings:
    check_rule(rule)
    if not math.isfinite(temperature) or temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise DraftheadsError(f"bad sampling settings temperature={temperature}, top_p={top_p}, top_k={top_k}; "
                              "need temperature >= 0, 0 < top_p <= 1, top_k >= 0")
    if max_new_tokens < 1:
        raise DraftheadsError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not (0 < epsilon < 1 and 0 < delta < 1):  # at 1 or above nothing but a certain token could be accepted
        raise DraftheadsError(f"typical_epsilon and typical_delta must be in (0, 1), got {epsilon} and {delta}")
    return DecodeSettings(rule, float(temperature), int(top_k), float(top_p), int(max_new_tokens),
                    eos_ids(target, eos_token_id), float(epsilon), float(delta))


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


def check_drafter_fits(drafter, target) -> None:
    """A learned drafter must have been built for a target of this hidden size and vocabulary."""
    if not isinstance(drafter, TrainableDrafter):
        return  # prompt lookup, and drafters of the caller's own: nothing to compare
    dims = target_dims(target.config)
    if (drafter.hidden_size, drafter.vocab_size) != (dims.hidden_size, dims.vocab_size):
        raise DraftheadsError(f"this drafter was built for a target with hidden size {drafter.hidden_size} and vocabulary "
                              f"{drafter.vocab_size}, but this target has {dims.hidden_size} and {dims.vocab_size}; "
                              "use the target it was trained on")


def resolve_tree(drafter, tree) -> Tree | DynamicTreeSpec | None:
    """The tree spec to draft: the given one parsed, or the drafter's default; None without a drafter."""
    if drafter is None:
        return None
    if not isinstance(drafter, Drafter):
        raise DraftheadsError(f"{type(drafter).__name__} is not a drafter (needs feature_layers, reset, observe, propose, default_tree)")
    spec = parse_tree(tree) if tree is not None else drafter.default_tree()
    if isinstance(spec, AutoTreeSpec):
        raise DraftheadsError("an auto tree is fitted to a drafter by draftheads eval; give chain:K, static:PATHS or dynamic:TOPK,DEPTH,TOTAL")
    if isinstance(spec, Tree) and spec.num_nodes == 1:
        raise DraftheadsError("the draft tree has no draft nodes; give chain:K with K >= 1 or some index paths")
    return spec
