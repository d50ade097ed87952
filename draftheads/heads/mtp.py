"""Multi-token prediction modules — DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2.

module k: h^k_t = Block(W [RMSNorm(h^{k-1}_t); RMSNorm(emb(x_{t+k}))]) [b, s, H], h^0 = target hidden
          -> shared target output head -> logits for x_{t+k+1}

Block is one decoder layer of the target's own class; the output head is the target's final norm
and lm_head, shared and frozen (DeepSeek-V3 shares the output head and applies its final norm).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.target_family import layer_rotary, norm_eps
from draftheads.core.tree import DynamicTreeSpec, Tree, parse_tree
from draftheads.heads.parts.common import DepthMetrics, TargetDistribution, batch_features, bind_frozen, masked_ce
from draftheads.heads.parts.draft_tree import Sampling, draft_dynamic, draft_static, lineage, node_depth
from draftheads.heads.parts.draft_vocab import check_draft_vocab, vocabulary
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.mtp_structure import MTPStructure
from draftheads.heads.parts.layers import (
    KVCache,
    bind_parts,
    build_decoder_layer,
    causal_visible,
    make_norm,
    run_layer,
    tree_visible,
)
from draftheads.heads.parts.objective import Objective, depth_weights, objective_of, per_depth_mean, take_objective
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import new_for_target, one_param_group

MAX_DEPTH = 8


@dataclass
class MTPConfig:
    """MTP hyper-parameters (hidden size, vocabulary and the block's class come from the target)."""

    type: Literal["mtp"] = doc("mtp", "head type")
    depth: int = doc(3, "D: number of sequential modules; module k predicts token t+k+1")
    loss_weights: list[float] | None = doc(None, "per-depth loss weights (default 1.0 each)")
    soft_labels: bool = doc(False, "train against the target's whole distribution of each token (from its cached "
                                   "features) instead of the generated token alone")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens, "
                                             "through the target lm_head's rows for them (default: the full "
                                             "vocabulary); several times cheaper draft steps")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:depth)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check(1 <= self.depth <= MAX_DEPTH, f"head.depth must be between 1 and {MAX_DEPTH}, got {self.depth}")
        if self.loss_weights is not None:
            check(len(self.loss_weights) == self.depth,
                  f"head.loss_weights has {len(self.loss_weights)} entries but head.depth is {self.depth}")
            check(all(w >= 0 for w in self.loss_weights), "head.loss_weights must be >= 0")
        check(self.draft_vocab_size is None or self.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
        # a bad or oversized tree is refused with the recipe, not at the first step
        parse_tree(self.default_tree, "head.default_tree")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Check what depends on the target (the modules' sizes and class come from its config when built)."""
        check_draft_vocab(self.draft_vocab_size, vocab_size)

    def structure(self, target_config) -> MTPStructure:
        """D modules of our own: [hnorm(h); enorm(emb)] in, the target's final norm out."""
        return MTPStructure(modules=self.depth)

    def step_loss_weights(self) -> list[float]:
        return self.loss_weights or [1.0] * self.depth


class MTPModule(nn.Module):
    """Module k: project [RMSNorm(h^{k-1}); RMSNorm(emb(x_{t+k}))] (2H -> H, in the order `structure` says), then
    one decoder layer; with an output norm of its own where the structure has one."""

    def __init__(self, target_config, structure: MTPStructure):
        super().__init__()
        hidden = target_dims(target_config).hidden_size
        eps = norm_eps(target_config)
        self.structure = structure
        self.layer = build_decoder_layer(target_config, overrides=dict(structure.layer_overrides))
        self.hnorm = make_norm(self.layer, hidden, eps)
        self.enorm = make_norm(self.layer, hidden, eps)
        self.proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.out_norm = make_norm(self.layer, hidden, eps) if structure.own_norm else None
        if structure.frozen_layer or structure.lora:
            self.layer.requires_grad_(False)
        if structure.lora:
            self.layer = with_lora(self.layer, *structure.lora)

    def forward(self, hidden, emb, rotary, position_ids, visible, cache=None) -> torch.Tensor:
        """hidden, emb [b, n, H] -> what the next step reads [b, n, H]: h^k, or its norm (carry_normed)."""
        emb = emb.to(hidden.dtype)
        if self.structure.zero_first_embedding:
            emb = emb.masked_fill((position_ids == 0)[..., None], 0)
        parts = [self.enorm(emb), self.hnorm(hidden)]
        fused = self.proj(torch.cat(parts if self.structure.embedding_first else parts[::-1], dim=-1))
        out = run_layer(self.layer, rotary, fused, position_ids, visible, cache)
        return self.out_norm(out) if self.structure.carry_normed else out


def with_lora(layer: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> nn.Module:
    """`layer` with LoRA adapters (peft) on its linear modules named in `targets`; only the adapters train."""
    from peft import LoraConfig, inject_adapter_in_model   # peft: only LoRA fine-tunes need it

    present = sorted({name.rsplit(".", 1)[-1] for name, m in layer.named_modules() if isinstance(m, nn.Linear)}
                     & set(targets))
    if not present:
        raise DraftheadsError(f"head.lora_targets {list(targets)} names none of this layer's linear modules; choose "
                              "among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (as the layer has)")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=present, lora_dropout=0.0, bias="none")
    return inject_adapter_in_model(config, layer)


class MTPDrafter(nn.Module):
    """D sequential MTP modules over the target's last hidden state."""

    feature_layers = (-1,)
    trains_target = False

    def __init__(self, config: MTPConfig, target_config):
        super().__init__()
        self.config = config
        dims = target_dims(target_config)
        self.hidden_size, self.vocab_size = dims.hidden_size, dims.vocab_size
        self.structure = config.structure(target_config)
        self.blocks = nn.ModuleList(MTPModule(target_config, self.structure) for _ in range(self.structure.modules))
        self.vocab = vocabulary(self, config.draft_vocab_size, dims.vocab_size)
        self.default_tree = parse_tree(config.default_tree) if config.default_tree else Tree.chain(config.depth)
        self.files = WeightsOnly(self)
        bind_frozen(self, _lm_head=None)
        self.reset()

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    def bind(self, target) -> "MTPDrafter":
        """Share the target's frozen embedding, final norm, lm_head and rotary embedding."""
        bind_parts(self, target, "MTP", ("embed", "norm", "lm_head"), rotary=layer_rotary(self.blocks[0].layer))
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.blocks[0].proj.weight.dtype

    def windowed(self, visible: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """visible [b, q, k] cut to the structure's sliding window: queries [b or 1, q] and keys [b or 1, k] are
        positions. Unchanged where the module's layer sees everything."""
        if self.structure.window is None:
            return visible
        return visible & ((queries[:, :, None] - keys[:, None, :]) < self.structure.window)

    def step(self, k: int) -> MTPModule:
        """The module draft step k (1-based) runs: module k, or, where fewer are shipped, vLLM's k mod count."""
        return self.blocks[self.structure.module_of(k)]

    def _logits(self, hidden: torch.Tensor, k: int = 1) -> torch.Tensor:
        """Step k's output [..., H] -> fp32 logits through its final norm (the target's, or the module's own) and the
        target's lm_head: [..., V], or [..., Vd] over the draft vocabulary (the lm_head's rows for it)."""
        if not self.structure.carry_normed:
            norm = self.step(k).out_norm if self.structure.own_norm else self._norm
            hidden = norm(hidden.to(norm.weight.dtype))
        return self.vocab.project(self._lm_head, hidden)

    def vocab_logits(self, hidden: torch.Tensor, k: int = 1) -> torch.Tensor:
        """Step k's output [..., H] -> [..., V] over the target vocabulary (-inf outside a draft vocabulary)."""
        return self.vocab.widen(self._logits(hidden, k))

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own logits from its final features [..., H], over the same columns as the modules'."""
        if self._lm_head is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        return self.vocab.project(self._lm_head, features)

    modules_follow_the_last_layer = True  # head.init: target_layer copies the target's last layer into every module

    def draft_layers(self) -> list[nn.Module]:
        """Each module's decoder layer, for head.init: target_layer."""
        return [block.layer for block in self.blocks]

    def fusion_inputs(self) -> list[tuple[nn.Linear, int]]:
        """Each module's proj over its normed [emb; h] (or [h; emb]) and where h's columns start."""
        return [(block.proj, self.hidden_size if self.structure.embedding_first else 0) for block in self.blocks]

    # ---- training -----------------------------------------------------------------------------

    def forward_modules(self, h0: torch.Tensor, input_ids: torch.Tensor, position_ids=None) -> list[torch.Tensor]:
        """h0 [b, s, H], input_ids [b, s] -> [h^1 [b, s-1, H], ..., h^D [b, s-D, H]].

        Module k runs over positions t = 0..s-k-1, the ones whose input token x_{t+k} exists.
        """
        outs, hidden = [], h0
        for k in range(1, self.config.depth + 1):
            n = input_ids.shape[1] - k
            if n <= 0:
                break
            positions = position_ids[:, :n] if position_ids is not None else None
            rope = positions if positions is not None else torch.arange(n, device=input_ids.device)[None]
            visible = self.windowed(causal_visible(positions, 1, n, device=input_ids.device), rope, rope)
            hidden = self.step(k)(hidden[:, :n], self._embed(input_ids[:, k : k + n]), self._rotary, rope, visible)
            outs.append(hidden)
        return outs

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Σ_k w_k · loss of module k's prediction of x_{t+k+1} (the recipe's token loss: by default CE, or soft CE
        with head.soft_labels); metrics per module."""
        h0 = batch_features(batch, self.dtype)[..., -self.hidden_size :]
        metrics = DepthMetrics(self.config.depth, h0.device)
        objective = objective_of(self)
        kind = objective.loss_for("kl" if self.config.soft_labels else "ce")
        soft = TargetDistribution(h0, batch, self.target_logits) if kind != "ce" else None
        sums, totals = [], []
        for k, hidden in enumerate(self.forward_modules(h0, batch["input_ids"], batch.get("position_ids")), start=1):
            logits = functools.partial(self._logits, k=k)
            loss_sum, correct, total = masked_ce(hidden, batch, k + 1, logits, self.vocab, soft, kind)
            metrics.add(k - 1, loss_sum, correct, total)
            sums.append(loss_sum)
            totals.append(total)
        weights = depth_weights(objective, self.config.step_loss_weights(), metrics.correct, metrics.total)
        return per_depth_mean(weights, sums, totals), metrics.as_dict()

    def set_objective(self, objective: Objective) -> None:
        """Any train.loss (it replaces head.soft_labels' choice); train.depth_weights over the modules."""
        take_objective(self, objective, self.config.depth)

    param_groups = one_param_group

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first)."""
        self.vocab.choose(token_counts)

    # ---- drafting (the Drafter protocol) -------------------------------------------------------
    #
    # With n committed positions (tokens x_1..x_n, x_n pending), module k can cache the positions
    # t <= n - k, whose input token x_{t+k} is committed. Drafting depth k runs module k at the
    # positions n-k+1..n-1 along each tree path: the entry of a node v at depth j sits at position
    # n - k + j, reads v's token and module k-1's entry of v's parent (the root's: module k-1's
    # output at its last committed position), and sees the committed cache and v's ancestors.

    def reset(self) -> None:
        self._tokens: torch.Tensor | None = None  # [b, n] committed x_1..x_n
        self._caches = [KVCache() for _ in range(self.config.depth)]   # one per step: steps may share a module
        self._inbox: list[torch.Tensor | None] = [None] * self.config.depth  # h^{k-1} not yet fed to step k
        self._root_out: torch.Tensor | None = None  # [b, H] h^1 at position n - 1

    def _committed(self, k: int) -> int:
        """Positions module k (1-based) holds for committed tokens: t <= n - k."""
        n = 0 if self._tokens is None else self._tokens.shape[1]
        return max(0, n - k + 1)

    @torch.no_grad()
    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, m, H], the token after each [b, m]."""
        for k, cache in enumerate(self._caches, start=1):
            cache.truncate(self._committed(k))
        self._tokens = next_tokens if self._tokens is None else torch.cat([self._tokens, next_tokens], dim=1)
        n = self._tokens.shape[1]
        incoming = features[..., -self.hidden_size :].to(self.dtype)  # h^0 at the new positions
        for k, cache in enumerate(self._caches, start=1):
            inbox = incoming if self._inbox[k - 1] is None else torch.cat([self._inbox[k - 1], incoming], dim=1)
            start = len(cache)
            take = max(0, min(inbox.shape[1], n - k + 1 - start))
            self._inbox[k - 1] = inbox[:, take:]
            incoming = inbox[:, :0]
            if take:
                tokens = self._tokens[:, start + k - 1 : start + k - 1 + take]  # x_{t+k}
                positions = torch.arange(start, start + take, device=tokens.device)[None]
                visible = self.windowed(causal_visible(None, 1, take, past=start, device=tokens.device), positions,
                                        torch.arange(start + take, device=tokens.device)[None])
                incoming = self.step(k)(inbox[:, :take], self._embed(tokens), self._rotary, positions, visible,
                                        cache)
                if k == 1:
                    self._root_out = incoming[:, -1]

    @torch.no_grad()
    def propose(self, tree: Tree | DynamicTreeSpec, *, temperature=0.0, top_k=0, top_p=1.0, generator=None) -> Proposal:
        """Draft a tree of depth <= D: depth k from module k (a chain of D by default)."""
        if self._root_out is None:
            raise ValueError("observe the prompt before calling propose")
        if tree.depth > self.config.depth:
            raise DraftheadsError(
                f"an MTP drafter with head.depth={self.config.depth} drafts at most {self.config.depth} tokens ahead, "
                f"but the tree is {tree.depth} deep; use a tree of depth <= {self.config.depth}"
            )
        for k, cache in enumerate(self._caches, start=1):
            cache.truncate(self._committed(k))
        sampling = Sampling(temperature, top_k, top_p, generator)
        expand = functools.partial(self._expand, {})
        root = self._tokens[:, -1]
        if isinstance(tree, DynamicTreeSpec):
            tree, tokens, q = draft_dynamic(tree, root, expand, sampling, self.vocab)
        else:
            tree = tree.compacted() if sampling.sampled else tree  # sampled children: no gaps in sibling ranks
            tokens, q = draft_static(tree, root, expand, sampling, self.vocab)
        return Proposal(tree, tokens, q)

    def _expand(self, previous: dict, nodes: list[int], parents: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """Children logits [b, len(nodes), V or Vd] of `nodes` (depth d) from module d + 1.

        `previous` holds module d's entries (node -> [b, H]) from the last call; replaced here.
        """
        d = node_depth(parents, nodes[0])
        if d == 0:
            return self._logits(self._root_out, 1)[:, None]
        k, n = d + 1, self._tokens.shape[1]
        cache = self._caches[k - 1]
        committed = len(cache)
        # every drafted ancestor of `nodes` gets an entry, except at positions before the prompt
        position = {v: n - k + node_depth(parents, v) for node in nodes for v in lineage(parents, node)}
        entries = sorted((v for v, p in position.items() if p >= 0), key=lambda v: (position[v], v))
        # module k-1's last committed output
        root_input = self._inbox[k - 1][:, 0] if self._inbox[k - 1].shape[1] else None
        hidden = torch.stack([previous[parents[v]] if parents[v] > 0 else root_input for v in entries], dim=1)
        positions = torch.tensor([position[v] for v in entries], device=tokens.device)[None]
        columns = {v: committed + i for i, v in enumerate(entries)}
        visible = tree_visible(entries, parents, columns, committed + len(entries), committed, tokens.device)
        keys = torch.cat([torch.arange(committed, device=tokens.device)[None], positions], dim=1)
        visible = self.windowed(visible, positions, keys)
        out = self.step(k)(hidden, self._embed(tokens[:, entries]), self._rotary, positions, visible, cache)
        previous.clear()
        previous.update({v: out[:, i] for i, v in enumerate(entries)})
        return self._logits(torch.stack([previous[v] for v in nodes], dim=1), k)

