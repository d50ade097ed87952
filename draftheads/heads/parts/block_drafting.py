"""Drafting with a block-parallel drafter: one forward per step drafts every depth at once.

The state of a generation is each draft layer's keys and values over the committed context (extended by `observe`,
never holding drafted positions) and the pending token. `propose` runs the block [pending, mask, ..., mask] once;
slot d's distribution is the draft of depth d for every node at that depth, whatever its ancestors (the slots do not
see each other's tokens). A static tree is filled with the same code as the other heads (heads/parts/draft_tree.py): the
children of a depth-d node are slot d+1's top-k (or draws without replacement from its warped distribution, given as
the node's q, so the strict rule stays exact: the draws of different nodes are independent).

A dynamic tree `dynamic:K,D,N` is the exact best N nodes among every path of depth <= D whose token at depth d is one
of slot d's K candidates, scored by summed log-probability (DDTree, arXiv 2604.12989). The autoregressive heads
approximate that with EAGLE-2's frontier (only the best K nodes of a level get children), because each expansion
costs them a forward; here every node's children are known from its depth alone, so a heap over (first child, next
sibling) finds the exact best N at no cost: a node whose parent ranked below the frontier, or a level-1 node past
the K-th, is kept when it scores high enough. q is None: which nodes are kept depends on the drafted values, and
the point-mass rule stays exact however the nodes were chosen.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.draft_tree import (Forest, Sampling, child_distribution, choose_children, draft_static,
                                         forest_to_tree, node_depth, single_root)


class BlockDrafting:
    """Per-generation state: the draft layers' context keys/values, their length, and the pending token."""

    def __init__(self):
        self.context: list | None = None  # per layer (keys, values) [b, kv_heads, committed, d]
        self.committed = 0
        self.root_token: torch.Tensor | None = None  # [b]

    @torch.no_grad()
    def observe(self, model, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, F], the token after each [b, n]."""
        n = next_tokens.shape[1]
        positions = torch.arange(self.committed, self.committed + n, device=next_tokens.device)[None]
        new = model.context_kv(model.context(features.to(model.dtype)), positions)
        if self.context is None:
            self.context = new
        else:
            self.context = [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2))
                            for (k, v), (nk, nv) in zip(self.context, new)]
        self.committed += n
        self.root_token = next_tokens[:, -1]

    @torch.no_grad()
    def propose(self, model, tree: Tree | DynamicTreeSpec, sampling: Sampling) -> Proposal:
        if self.root_token is None:
            raise DraftheadsError("DFlash propose() called before observe(); feed the prompt's features first")
        limit = model.config.block_size - 1
        if tree.depth > limit:
            raise DraftheadsError(f"tree depth {tree.depth} exceeds what a block of {model.config.block_size} drafts "
                                  f"({limit}); use a tree of depth <= {limit} or train a larger head.block_size")
        slots = model.draft_logits(model.run_block(self.root_token, self.committed, self.context))  # [b, B-1, V(d)]
        return tree_from_slots(tree, self.root_token, slots, sampling, model.vocab)


def tree_from_slots(tree: Tree | DynamicTreeSpec, root_token: torch.Tensor, slots: torch.Tensor, sampling: Sampling,
                    vocab) -> Proposal:
    """A static or dynamic tree grown from per-depth logits slots [b, D, V(d)] (slot d - 1 drafts depth d, whatever
    the node's ancestors): what every drafter that makes all depths in one forward proposes (DFlash, P-EAGLE)."""

    def expand(nodes: list[int], parents: list[int], tokens: torch.Tensor) -> torch.Tensor:
        return slots[:, [node_depth(parents, node) for node in nodes]]

    if isinstance(tree, DynamicTreeSpec):
        forest = best_first(tree, single_root(root_token), depth_candidates(slots[0, : tree.depth], tree.top_k,
                                                                            sampling, vocab))
        tree, tokens = forest_to_tree(forest, list(range(1, len(forest.parents))))
        tokens, q = tokens.to(root_token.device), None
    else:
        tree = tree.compacted() if sampling.sampled else tree  # sampled children: no gaps in sibling ranks
        tokens, q = draft_static(tree, root_token, expand, sampling, vocab)
    return Proposal(tree, tokens, q)


def depth_candidates(slots: torch.Tensor, top_k: int, sampling: Sampling, vocab):
    """candidates(depth, token) for best_first when a node's children depend on its depth alone: each depth's top_k
    (or top_k draws) over per-depth logits slots [D, V(d)], ranked by log-probability, found once per depth."""
    probs = child_distribution(slots, sampling, top_k)  # [D, V(d)]
    picked = choose_children(probs, top_k, sampling)  # [D, K]
    logp, order = probs.gather(-1, picked).log().sort(-1, descending=True)
    logp, tokens = logp.tolist(), vocab.to_target(picked.gather(-1, order)).tolist()
    return lambda depth, token: (logp[depth], tokens[depth])


Candidates = Callable[[int, int], tuple[list[float], list[int]]]


def best_first(spec: DynamicTreeSpec, root: int, candidates: Candidates) -> Forest:
    """The best `spec.total_tokens` nodes of depth <= spec.depth, found best-first. `candidates(depth, token)` gives
    the children of a node at `depth` whose token is `token` (log-probabilities in decreasing order, their tokens);
    it is asked once per kept node that may have children. Popping a node offers its first child and its next
    sibling, neither scoring above it, so nodes leave the heap in score order and every kept node's parent and elder
    siblings are kept before it."""
    forest = Forest(tokens=[root])
    children = {0: candidates(0, root)}
    heap = [(-children[0][0][0], 0, 0)]  # (-score, parent node, rank among its children)
    while heap and len(forest.parents) <= spec.total_tokens:
        negative, parent, rank = heapq.heappop(heap)
        logp, tokens = children[parent]
        forest.add(parent, tokens[rank], -negative)
        node = len(forest.parents) - 1
        if forest.depths[node] < spec.depth:
            children[node] = candidates(forest.depths[node], tokens[rank])
            heapq.heappush(heap, (negative - children[node][0][0], node, 0))
        if rank + 1 < len(logp):
            heapq.heappush(heap, (-(forest.scores[parent] + logp[rank + 1]), parent, rank + 1))
    return forest
