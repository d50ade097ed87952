"""Medusa heads — Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads".

h_t [b, s, H] (target's last hidden state, after its final norm)
  -> head k: num_layers residual blocks y + SiLU(W y + b) -> lm head -> logits for x_{t+k+1}

Medusa-2 (`type: medusa2`, joint LoRA training of the target) lives in heads/medusa2.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import drawable, pick_children, warp_probs
from draftheads.core.target_dims import target_dims
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.common import DepthMetrics, TargetDistribution, batch_features, bind_frozen, masked_ce
from draftheads.heads.parts.draft_vocab import check_draft_vocab, vocabulary
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.objective import Objective, depth_weights, objective_of, per_depth_mean, take_objective
from draftheads.heads.parts.protocol import new_for_target, one_param_group

MAX_HEADS = 10


@dataclass
class MedusaConfig:
    """Medusa head hyper-parameters (hidden size and vocabulary come from the target)."""

    type: Literal["medusa"] = doc("medusa", "head type")
    num_heads: int = doc(4, "K: head k predicts token t+k+1")
    num_layers: int = doc(1, "residual blocks per head (each with its own weights)")
    lm_head: Literal["shared", "own"] = doc("shared", "'shared': the target's frozen lm_head; 'own': a trainable copy "
                                                      "per head (only the draft vocabulary's rows when there is one)")
    loss_decay: float = doc(0.8, "lambda: head k's loss is weighted lambda^(k-1)")
    soft_labels: bool = doc(False, "train against the target's whole distribution of each token (from its cached "
                                   "features) instead of the generated token alone")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens: "
                                             "through the target lm_head's rows for them ('shared'), or with own lm "
                                             "heads of only those rows, started from the target's ('own') (default: "
                                             "the full vocabulary)")
    head_lr: float | None = doc(None, "learning rate of the heads (default: train.lr)")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check_heads(self)

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Check what depends on the target (hidden size and vocabulary come from its config when built)."""
        check_draft_vocab(self.draft_vocab_size, vocab_size)

    @property
    def depth(self) -> int:
        """How many tokens past the target's own next token this drafter can propose."""
        return self.num_heads


def check_heads(config) -> None:
    """The heads' settings, as Medusa and Medusa-2 configs both hold them."""
    check(1 <= config.num_heads <= MAX_HEADS,
          f"head.num_heads must be between 1 and {MAX_HEADS}, got {config.num_heads}")
    check(1 <= config.num_layers <= 8, f"head.num_layers must be between 1 and 8, got {config.num_layers}")
    check(0 < config.loss_decay <= 1, f"head.loss_decay must be in (0, 1], got {config.loss_decay}")
    check(config.head_lr is None or config.head_lr > 0, f"head.head_lr must be positive, got {config.head_lr}")
    check(config.draft_vocab_size is None or config.draft_vocab_size > 0, "head.draft_vocab_size must be positive")


# A static Medusa-style tree (48 drafts, depth <= 5), chosen greedily by expected accepted length
# under assumed per-depth, per-rank hit rates (head 1 top-1 0.60, head 2 0.42, head 3 0.32, ...;
# rank r+1 much rarer than rank r). Replace it with a tree fitted to a trained drafter's measured
# accuracies when they are known. Paths deeper than num_heads are dropped.
DEFAULT_TREE_PATHS = (
    (0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,), (9,),
    (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1),
    (3, 0), (4, 0), (5, 0), (6, 0), (7, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 0, 4), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 3, 0),
    (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (3, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
    (0, 0, 0, 0, 0),
)


class ResidualBlock(nn.Module):
    """y + SiLU(W y + b), W and b zero: a new block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y + nn.functional.silu(self.linear(y))


class MedusaDrafter(nn.Module):
    """K Medusa heads over the target's last hidden state; head k (1-based) predicts x_{t+k+1}.

    Parameters: heads.{k}.{i}.linear (K x num_layers distinct blocks) and, with lm_head 'own',
    lm_heads.{k} (the target's lm_head copied in at bind, or its rows for the draft vocabulary once that
    is chosen). With lm_head 'shared' the target's frozen lm_head is bound, not registered.
    Medusa-2 (heads/medusa2.py) holds one of these beside the target's LoRA adapter.
    """

    feature_layers = (-1,)
    trains_target = False

    def __init__(self, config: MedusaConfig, target_config):
        super().__init__()
        dims = target_dims(target_config)
        hidden_size, vocab_size = dims.hidden_size, dims.vocab_size
        self.config = config
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.heads = nn.ModuleList(
            [nn.Sequential(*[ResidualBlock(hidden_size) for _ in range(config.num_layers)])
             for _ in range(config.num_heads)]
        )
        if config.lm_head == "own":
            rows = config.draft_vocab_size or vocab_size
            self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, rows, bias=False) for _ in range(config.num_heads)])
            # False until bind() copies the target's lm_head in; a loaded drafter carries True.
            self.register_buffer("lm_heads_initialised", torch.tensor(False))
        self.vocab = vocabulary(self, config.draft_vocab_size, vocab_size)
        self.default_tree = Tree.from_paths([p for p in DEFAULT_TREE_PATHS if len(p) <= config.num_heads])
        self.files = WeightsOnly(self)
        bind_frozen(self, _lm_head=None, _feature=None, _pending=None)

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    def bind(self, target) -> "MedusaDrafter":
        """Attach the target's frozen lm_head (own lm heads start as its rows)."""
        bind_frozen(self, _lm_head=target.get_output_embeddings())
        if self.config.lm_head == "own" and not bool(self.lm_heads_initialised):
            self._copy_target_rows()
        return self

    @torch.no_grad()
    def _copy_target_rows(self) -> None:
        """Start every own lm head as the target's lm_head (its rows for the draft vocabulary, if any)."""
        weight = self._lm_head.weight
        rows = weight[self.vocab.ids.to(weight.device)] if self.vocab.restricted else weight
        for head in self.lm_heads:
            head.weight.copy_(rows)
        self.lm_heads_initialised.fill_(True)

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first);
        own lm heads restart as the target's rows for them."""
        self.vocab.choose(token_counts)
        if self.config.lm_head == "own":
            if self._lm_head is not None:
                self._copy_target_rows()
            else:
                self.lm_heads_initialised.fill_(False)  # bind() copies them

    @property
    def dtype(self) -> torch.dtype:
        return self.heads[0][0].linear.weight.dtype

    def _shared_head(self, y: torch.Tensor) -> torch.Tensor:
        """The target's lm_head on y [..., H]: [..., V], or [..., Vd] over the draft vocabulary."""
        if self._lm_head is None:
            raise DraftheadsError("the Medusa drafter is not bound to a target; call drafter.bind(target) first")
        if self.vocab.restricted:
            return self.vocab.project(self._lm_head, y)
        return self._lm_head(y)  # the whole vocabulary's logits stay in the target's dtype: no [D, V] cast per step

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """Head k (0-based: predicts x_{t+k+2}) on hidden [..., H] -> logits [..., V] ([..., Vd] with a draft
        vocabulary)."""
        if self._lm_head is None:
            raise DraftheadsError("the Medusa drafter is not bound to a target; call drafter.bind(target) first")
        y = self.heads[k](hidden)
        return self.lm_heads[k](y) if self.config.lm_head == "own" else self._shared_head(y)

    def draft_logits(self, feature: torch.Tensor, depth: int, widen: bool = True) -> torch.Tensor:
        """feature [b, H] -> [b, depth, V]: heads 1..depth at one position ([b, depth, Vd] over a draft
        vocabulary unless `widen`).

        A shared lm_head runs once over all heads' outputs: one [depth, H] x [H, V] product reads
        the (large) vocabulary matrix once instead of once per head.
        """
        if self.config.lm_head == "own":
            logits = torch.stack([self.head_logits(k, feature) for k in range(depth)], dim=1)
        else:
            logits = self._shared_head(torch.stack([self.heads[k](feature) for k in range(depth)], dim=1))
        return self.vocab.widen(logits.float()) if widen and self.vocab.restricted else logits

    # ---- training ----------------------------------------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """sum_k decay^(k-1) CE_k over counted positions, on the target's cached or online features."""
        return self.heads_loss(batch_features(batch, self.dtype), batch)

    def heads_loss(self, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        """hidden [b, s, H] -> (weighted loss, per-head metrics). Head k predicts shift k + 2; its loss is the
        recipe's (by default CE, or soft CE with head.soft_labels), weighted loss_decay^k unless train.depth_weights
        says otherwise."""
        metrics = DepthMetrics(self.config.num_heads, hidden.device)
        objective = objective_of(self)
        kind = objective.loss_for("kl" if self.config.soft_labels else "ce")
        soft = TargetDistribution(hidden, batch, self.target_logits) if kind != "ce" else None
        sums, totals = [], []
        for k in range(self.config.num_heads):
            loss_sum, correct, total = masked_ce(hidden, batch, k + 2, lambda rows, k=k: self.head_logits(k, rows),
                                                 self.vocab, soft, kind)
            metrics.add(k, loss_sum, correct, total)
            sums.append(loss_sum)
            totals.append(total)
        own = [self.config.loss_decay**k for k in range(self.config.num_heads)]
        weights = depth_weights(objective, own, metrics.correct, metrics.total)
        return per_depth_mean(weights, sums, totals), metrics.as_dict()

    def set_objective(self, objective: Objective) -> None:
        """Any train.loss (it replaces head.soft_labels' choice); train.depth_weights over the heads."""
        take_objective(self, objective, self.config.num_heads)

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own logits from its final features [..., H], over the heads' columns (fp32)."""
        if self._lm_head is None:
            raise DraftheadsError("the Medusa drafter is not bound to a target; call drafter.bind(target) first")
        return self.vocab.project(self._lm_head, features)

    def param_groups(self, lr: float) -> list[dict]:
        """One group: the heads, at head.head_lr when set."""
        return one_param_group(self, self.config.head_lr or lr)

    # ---- drafting (core/drafter.py: Drafter) ---------------------------------------

    def reset(self) -> None:
        bind_frozen(self, _feature=None, _pending=None)

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Keep only the newest position: Medusa heads read h_t alone. features [b, n, H], next_tokens [b, n]."""
        bind_frozen(self, _feature=features[:, -1].to(self.dtype), _pending=next_tokens[:, -1])

    @torch.no_grad()
    def propose(self, tree: Tree | DynamicTreeSpec, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator=None) -> Proposal:
        """Fill a static tree: a node at depth d with rank r gets head d's r-th token.

        Every node of a depth shares head d's distribution (Medusa's Cartesian-product tree), so
        each head runs once per step. With a generator and temperature > 0 the r-th token is the
        r-th draw without replacement from the warped q_d (returned per node in `q`; a tree with gaps
        in its sibling ranks is drafted as its gap-free version); otherwise the r-th best by logit. If q_d
        has fewer tokens than the tree's width at depth d (top-k / top-p truncation), the nodes that
        cannot be filled are pruned from the returned tree.
        """
        tree = self._check_tree(tree)
        if self._feature is None:
            raise DraftheadsError("Medusa propose() called before observe(); feed the prompt's features first")
        depth = tree.depth
        logits = self.draft_logits(self._feature, depth, widen=False)  # [b, D, V] or [b, D, Vd]
        sampled = generator is not None and temperature > 0
        if sampled:  # each node's children are the first draws of q_d, one per sibling: no gaps in the ranks
            tree = tree.compacted()
        widths = [1 + max(r for r, d in zip(tree.ranks, tree.depths) if d == level) for level in range(1, depth + 1)]
        if sampled:
            q = drawable(warp_probs(logits, temperature, top_k, top_p))
            picks = [self.vocab.to_target(pick_children(q[:, d], widths[d], generator)) for d in range(depth)]
            tree = _prune(tree, [p.shape[1] for p in picks])
            q = self.vocab.widen_probs(q)
        else:
            picks = [self.vocab.to_target(torch.topk(logits[:, d], widths[d], dim=-1).indices) for d in range(depth)]
        tokens = self._fill(tree, picks)
        if not sampled:
            return Proposal(tree, tokens)
        # node i's children are drawn from q of depth(i) + 1; the deepest nodes have no children
        q_by_depth = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)  # [b, D + 1, V]
        return Proposal(tree, tokens, q_by_depth[:, torch.tensor(tree.depths, device=q.device)])

    def _check_tree(self, tree: Tree | DynamicTreeSpec) -> Tree:
        if isinstance(tree, DynamicTreeSpec):
            raise DraftheadsError("Medusa heads cannot build dynamic trees; give a static tree (e.g. chain:K or "
                                  "index paths)")
        if tree.depth > self.config.num_heads:
            raise DraftheadsError(
                f"tree depth {tree.depth} exceeds the drafter's {self.config.num_heads} Medusa heads; "
                "use a shallower tree"
            )
        return tree

    def _fill(self, tree: Tree, picks: list[torch.Tensor]) -> torch.Tensor:
        """tokens [b, N]: root = pending token, node i = picks[depth_i - 1][:, rank_i]."""
        width = max(p.shape[1] for p in picks)
        padded = torch.stack([nn.functional.pad(p, (0, width - p.shape[1])) for p in picks], dim=1)  # [b, D, W]
        depths = torch.tensor(tree.depths[1:], device=padded.device) - 1
        ranks = torch.tensor(tree.ranks[1:], device=padded.device)
        return torch.cat([self._pending[:, None].to(padded.device), padded[:, depths, ranks]], dim=1)


def _prune(tree: Tree, available: list[int]) -> Tree:
    """Drop nodes whose rank at some depth exceeds the tokens drawn there (and their subtrees)."""
    keep = [p for p in tree.paths if all(r < available[d] for d, r in enumerate(p))]
    return tree if len(keep) == len(tree.paths) else Tree.from_paths(keep)
