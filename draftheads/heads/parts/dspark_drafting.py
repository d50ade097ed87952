"""Drafting with DSpark: one backbone forward for the block, then the Markov head left to right
(heads/parts/markov_drafting.py: chains, static trees and DDTree's dynamic trees, each node's children given its own
token), and confidence-scheduled verification.

Confidence-scheduled verification (`head.verify: scheduled`, costs given by `set_verify_costs`): a drafted chain is
cut where one more draft stops paying. With P_j the product of the confidences up to slot j (the chance that drafts
0..j are all accepted), verifying L drafts commits 1 + Σ_{j<L} P_j tokens on average and costs draft + verify(L + 1)
seconds; draft j is kept while

    (E + P_j) / (draft + verify(j + 2)) > E / (draft + verify(j + 1)),      E = 1 + Σ_{i<j} P_i

and the chain ends at the first draft that fails it. Draft j's confidence reads the token before it (x_j) and the
slot's hidden state, never x_{j+1}: whether x_{j+1} is verified is decided before it is drawn, a stopping time of the
drafted chain, so the strict rule with q stays exact (tests/decoding/test_strict.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.block_drafting import BlockDrafting
from draftheads.heads.parts.draft_tree import Sampling
from draftheads.heads.parts.markov_drafting import markov_tree


@dataclass(frozen=True)
class VerifyCosts:
    """Seconds of the draft pass and of a verify forward of n tokens, verify_s[n - 1] for n = 1..len(verify_s)."""

    draft_s: float
    verify_s: tuple[float, ...]

    def __post_init__(self):
        if self.draft_s < 0 or not self.verify_s or min(self.verify_s) <= 0:
            raise DraftheadsError(f"verify costs must be positive seconds, got {self}")

    def verify(self, tokens: int) -> float:
        return self.verify_s[min(tokens, len(self.verify_s)) - 1]


def scheduled_length(confidence: list[float], costs: VerifyCosts) -> int:
    """How many of a chain's drafts to verify, given each draft's acceptance confidence (conditional on the drafts
    before it being accepted): the first draft whose expected tokens no longer pay for its verify time ends it."""
    expected, reach = 1.0, 1.0
    for j, c in enumerate(confidence):
        reach *= c
        now = expected / (costs.draft_s + costs.verify(j + 1))
        if (expected + reach) / (costs.draft_s + costs.verify(j + 2)) <= now:
            return j
        expected += reach
    return len(confidence)


class DSparkDrafting(BlockDrafting):
    """BlockDrafting's state (the context's keys and values, the pending token), drafting with the Markov head."""

    @torch.no_grad()
    def propose(self, model, tree: Tree | DynamicTreeSpec, sampling: Sampling) -> Proposal:
        if self.root_token is None:
            raise DraftheadsError("DSpark propose() called before observe(); feed the prompt's features first")
        limit = model.config.block_size
        if tree.depth > limit:
            raise DraftheadsError(f"tree depth {tree.depth} exceeds what a DSpark block of {limit} drafts; use a "
                                  f"tree of depth <= {limit} or train a larger head.block_size")
        hidden = model.run_block(self.root_token, self.committed, self.context)  # [b, B, H]
        proposal = markov_tree(model, tree, self.root_token, model.draft_logits(hidden), sampling)
        if isinstance(tree, Tree) and proposal.tree.is_chain and model.verify_costs is not None and tree.depth > 0:
            return scheduled_chain(model, hidden, proposal)
        return proposal


def scheduled_chain(model, hidden: torch.Tensor, drafted: Proposal) -> Proposal:
    """The drafted chain cut to the drafts whose confidence pays for their verification."""
    tokens, q = drafted.tokens, drafted.q
    depth = tokens.shape[1] - 1
    confidence = model.confidence_logits(hidden[:, :depth], tokens[:, :depth]).sigmoid()[0].tolist()
    keep = scheduled_length(confidence, model.verify_costs)
    return Proposal(Tree.chain(keep), tokens[:, : keep + 1], None if q is None else q[:, : keep + 1])
