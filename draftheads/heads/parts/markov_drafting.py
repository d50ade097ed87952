"""Drafting a tree from per-depth base logits and a Markov head: each node's children given its own token.

A block drafter's slot d gives every node at depth d the same base logits; a Markov head (heads/parts/markov_head.py)
adds a bias conditioned on the node's own token, so a node's children come from base_d + bias(node's token). In a
chain that is left-to-right sampling of the block; in a static tree each node's children are drawn from (or are the
top-k of) exactly that distribution, given as the node's q, so the strict rule stays exact
(heads/parts/draft_tree.draft_static). A dynamic tree `dynamic:K,D,N` is DDTree's best-first search with each node's
candidates computed when the node is kept (they depend on the node's token, not only its depth). DSpark and P-EAGLE
with head.markov_rank > 0 draft this way.
"""

from __future__ import annotations

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.block_drafting import best_first
from draftheads.heads.parts.draft_tree import (Sampling, child_distribution, choose_children, draft_static,
                                               forest_to_tree, node_depth, single_root)


def markov_tree(model, tree: Tree | DynamicTreeSpec, root_token: torch.Tensor, base: torch.Tensor,
                sampling: Sampling) -> Proposal:
    """The tree drafted from base [b, D, C] (slot d: the base logits of every node at depth d) and the model's
    markov_logits(base, previous token)."""
    if isinstance(tree, DynamicTreeSpec):
        forest = best_first(tree, single_root(root_token), markov_candidates(model, base[0], tree.top_k, sampling))
        tree, tokens = forest_to_tree(forest, list(range(1, len(forest.parents))))
        return Proposal(tree, tokens.to(root_token.device), None)

    def expand(nodes: list[int], parents: list[int], tokens: torch.Tensor) -> torch.Tensor:
        return model.markov_logits(base[:, [node_depth(parents, node) for node in nodes]], tokens[:, nodes])

    tree = tree.compacted() if sampling.sampled else tree
    tokens, q = draft_static(tree, root_token, expand, sampling, model.vocab)
    return Proposal(tree, tokens, q)


def markov_candidates(model, base: torch.Tensor, top_k: int, sampling: Sampling):
    """candidates(depth, token) for best_first: the top_k children (or draws) of a node at `depth` whose token is
    `token`, by log-probability, from base[depth] + the Markov bias of the token.

    A node's candidates depend only on (depth, token), so they are kept once computed; and a node's siblings are
    computed with it, in one product: the bias's [rank x columns] matrix is read once for them all (a single row's
    product is bound by reading that matrix, ~0.2 ms for 256 x 8,192 in bf16)."""
    found: dict[tuple[int, int], tuple[list[float], list[int]]] = {}
    siblings: dict[tuple[int, int], list[int]] = {}  # (depth, token) -> the tokens drafted beside it

    def compute(depth: int, tokens: list[int]) -> None:
        prev = torch.tensor(tokens, device=base.device)
        logits = model.markov_logits(base[depth][None].expand(len(tokens), -1), prev)
        probs = child_distribution(logits, sampling, top_k)
        picked = choose_children(probs, top_k, sampling)
        logp, order = probs.gather(-1, picked).log().sort(-1, descending=True)
        for token, scores, kids in zip(tokens, logp.tolist(), model.vocab.to_target(picked.gather(-1, order)).tolist()):
            found[(depth, token)] = (scores, kids)
            siblings.update({(depth + 1, kid): kids for kid in kids})

    def candidates(depth: int, token: int) -> tuple[list[float], list[int]]:
        if (depth, token) not in found:
            group = siblings.get((depth, token), [token])
            compute(depth, [t for t in dict.fromkeys([token, *group]) if (depth, t) not in found])
        return found[(depth, token)]

    return candidates
