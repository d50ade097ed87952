"""A learned drafter plus prompt lookup: the lookup chain grafted onto the learned tree as an extra branch.

Each step the learned drafter proposes its tree (top-k children, deterministic), and the chain prompt
lookup would propose alone (longest n-gram match, most recent, carried on by older matches) is walked
down from the root: while its tokens equal a learned node's they share that node, and from the first
token the learned tree lacks it continues as a new branch (the next free sibling rank). The target then
verifies both in one forward and the acceptance rule keeps whichever path is better, so neither source
is ever chosen up front.
Copying from the prompt is where learned heads are weakest (long verbatim spans, code identifiers), so
the two complement each other.

With `switch=True` the combination stops paying for the learned tree while the text is being copied:
when the previous copied paths had at least `copy_after` of their tokens committed and the copier finds a
continuation again, the copier's own proposal is verified alone: what it drafts by itself (prompt lookup's
chain, suffix decoding's tree of up to 12 levels), no learned drafting, instead of the whole grafted tree, whose
copied paths stop at lookup_depth to keep its verification small. The first time the copy misses or finds nothing,
the grafted tree comes back. It saves the learned drafting, a large share of a step on a CPU, where lookup
carries the text: it pays on copy-heavy retrieval and loses elsewhere, where the learned branches it drops
would have been accepted (docs/general-drafters.md).

With a `gate` (decoding/gate.py) the learned tree is drafted only while the tokens it adds pay for what it costs
on this machine, judged apart for steps where lookup found a chain and steps where it found nothing; a step that
does not draft it verifies the copier's own proposal alone, or is a plain decoding step. Where the drafter adds
little the combination runs as the copier alone, where it adds much as the grafted tree.

The learned drafter reads the committed positions when it next drafts (its prompt at once), so steps that do not
draft it cost nothing of it.

Children are always deterministic (Proposal.q is None): the learned drafter is asked for its top-k
(generator=None) so that every rule, strict sampling included, treats all drafts as point masses and
stays exact. Which tree is drafted depends only on the committed text, so the switch and the gate keep that too.
"""

from __future__ import annotations

import copy

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.gate import LearnedGate
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.stats import shared_prefix_length


def graft(tree: Tree, tokens: list[int], chain: list[int]) -> tuple[Tree, list[int]]:
    """The tree with `chain` (tokens below the root) merged in; tokens [N'] per node of the new tree.

    tokens: [N] token of each node of `tree` (node 0 = root). Shared prefixes are not duplicated.
    """
    by_path = {(): tokens[0]}
    by_path.update({path: tokens[i] for i, path in enumerate(tree.paths, start=1)})
    kids: dict[tuple[int, ...], dict[int, int]] = {}  # path -> {token: rank} of existing children
    for path in tree.paths:
        kids.setdefault(path[:-1], {}).setdefault(by_path[path], path[-1])
    path: tuple[int, ...] = ()
    for token in chain:
        ranks = kids.setdefault(path, {})
        if token not in ranks:
            # one past the largest rank in use, so the new branch never takes an existing path
            ranks[token] = 1 + max((p[-1] for p in by_path if len(p) == len(path) + 1 and p[:-1] == path), default=-1)
        path = path + (ranks[token],)
        by_path[path] = token
    merged = Tree.from_paths([p for p in by_path if p])
    return merged, [by_path[()]] + [by_path[p] for p in merged.paths]


def graft_paths(tree: Tree, tokens: list[int], paths: list[list[int]]) -> tuple[Tree, list[int]]:
    """`graft` of every path in turn (the leaves of a copied tree: shared prefixes merge again)."""
    for path in paths:
        tree, tokens = graft(tree, tokens, path)
    return tree, tokens


def token_paths(proposal: Proposal) -> list[list[int]]:
    """The tokens along every root-to-leaf path of a one-row proposal, root left out."""
    tokens, tree = proposal.tokens[0].tolist(), proposal.tree
    return [[tokens[node] for node in tree.ancestors(leaf)[1:]] for leaf in tree.leaves if leaf]


ROOT_ONLY = Tree.from_paths([])


class CombinedDrafter:
    """Learned drafter + prompt lookup: the learned tree with the lookup chain as an extra branch (with `switch`,
    the lookup chain alone while the text is being copied; with `gate`, the learned tree only while it pays). One
    sequence per drafter, like every drafter's state: the batched loop gives each row its own copy (`__copy__`)."""

    def __init__(self, learned, lookup: PromptLookupDrafter | None = None, lookup_depth: int = 6,
                 switch: bool = False, copy_after: int = 2, gate: LearnedGate | None = None):
        if copy_after < 1:
            raise DraftheadsError(f"copy_after counts committed lookup tokens and must be at least 1, got {copy_after}")
        if switch and gate is not None:
            raise DraftheadsError("a combination either switches on copied text or gates on cost; give switch or gate")
        self.learned = learned
        self.lookup = lookup or PromptLookupDrafter()
        self.lookup_depth = lookup_depth
        self.switch, self.copy_after, self.gate = switch, copy_after, gate
        self.feature_layers = tuple(learned.feature_layers)
        self.reset_state()

    def reset_state(self) -> None:
        self.last_paths: list[list[int]] = []   # the copied paths proposed last step ([] when none)
        self.copied = 0                          # how many of their tokens the last step committed
        self.drafted: bool | None = None  # whether this step drafted the learned tree (None: no step proposed yet)
        self.unread: list[tuple[torch.Tensor, torch.Tensor]] = []   # committed positions the learned drafter lacks
        self.learned_started = False

    def __copy__(self) -> "CombinedDrafter":
        """Another row's drafter (decoding/decoder.py): both parts copied, so each keeps state of its own."""
        gate = self.gate.fresh() if self.gate is not None else None
        return CombinedDrafter(copy.copy(self.learned), copy.copy(self.lookup), self.lookup_depth,
                               self.switch, self.copy_after, gate)

    def reset(self) -> None:
        self.learned.reset()
        self.lookup.reset()
        if self.gate is not None:
            self.gate.reset()
        self.reset_state()

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.lookup.observe(features, next_tokens)
        if self.learned_started:
            self.unread.append((features, next_tokens))
        else:
            self.learned.observe(features, next_tokens)
            self.learned_started = True
        # the step's accepted drafts come first in next_tokens: how far along a copied path they went
        committed = next_tokens[0].tolist()
        self.copied = max((shared_prefix_length(path, committed) for path in self.last_paths), default=0)
        if self.gate is not None and self.drafted is not None:
            without = self.copied + 1   # the copied prefix, then the target's own token
            self.gate.record(bool(self.last_paths), self.drafted, without, len(committed) - without)
        self.last_paths, self.drafted = [], None

    def read_unread(self) -> None:
        """Give the learned drafter the positions committed since it last drafted, in one pass."""
        if self.unread:
            features = torch.cat([f for f, _ in self.unread], dim=1)
            tokens = torch.cat([t for _, t in self.unread], dim=1)
            self.unread = []
            self.learned.observe(features, tokens)

    @property
    def default_tree(self):
        return self.learned.default_tree

    def propose(self, tree, *, temperature=0.0, top_k=0, top_p=1.0, generator=None) -> Proposal:
        paths = self.last_paths = self.lookup.copy_paths(self.lookup_depth)
        if self.gate is not None:
            self.drafted = self.gate.draft_learned(bool(paths))
        else:
            self.drafted = not (self.switch and paths and self.copied >= self.copy_after)
        if not self.drafted and not paths:   # a plain decoding step: nothing to copy, the learned tree not worth it
            return Proposal(ROOT_ONLY, torch.tensor([[self.lookup.pending]], dtype=torch.long,
                                                    device=self.lookup.device))
        if not self.drafted:   # the copier as it drafts alone: as deep as its match carries it, not lookup_depth
            alone = self.lookup.propose(self.lookup.default_tree)
            self.last_paths = token_paths(alone)
            return alone
        self.read_unread()
        base = self.learned.propose(tree, temperature=temperature, top_k=top_k, top_p=top_p, generator=None)
        if not paths:
            return Proposal(base.tree, base.tokens)
        merged, tokens = graft_paths(base.tree, base.tokens[0].tolist(), paths)
        return Proposal(merged, torch.tensor([tokens], dtype=torch.long, device=base.tokens.device))

    @property
    def copy_nodes(self) -> int:
        """The most nodes the copied paths add to the learned tree."""
        return self.lookup.copy_budget(self.lookup_depth)
