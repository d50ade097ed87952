"""Drafting with a block-parallel drafter: one forward per step drafts every depth at once.

The state of a generation is each draft layer's keys and values over the committed context (extended by `observe`,
never holding drafted positions) and the pending token. `propose` runs the block [pending, mask, ..., mask] once;
slot d's distribution is the draft of depth d for every node at that depth, whatever its ancestors (the slots do not
see each other's tokens). Trees are grown from those per-slot distributions with the same code as the other heads
(heads/draft_tree.py): a static tree's children of a depth-d node are slot d+1's top-k (or draws without replacement
from its warped distribution, given as the node's q, so the strict rule stays exact: the draws of different nodes
are independent), and a dynamic tree keeps the best nodes by summed log-probability, best-first (as DDTree does; q is
then None, which the point-mass rule handles exactly).
"""

from __future__ import annotations

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.draft_tree import Sampling, draft_dynamic, draft_static, node_depth


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
        tree, tokens, q = draft_dynamic(tree, root_token, expand, sampling, vocab)
    else:
        tree = tree.compacted() if sampling.sampled else tree  # sampled children: no gaps in sibling ranks
        tokens, q = draft_static(tree, root_token, expand, sampling, vocab)
    return Proposal(tree, tokens, q)
