"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"; served by ArcticInference and vLLM's `method: suffix`):
draft trees copied from text seen before, this request's and earlier requests' outputs, with no model.

Two suffix tries (decoding/suffix_tree.py) hold the text: this request's own (its prompt and what it generated so
far, what prompt lookup reads) and a cache of outputs shared by every request the drafter serves (each row of a
batch and each later generation adds its output as it is generated; the oldest outputs leave past a token budget).
Each step the text's longest suffix that occurred before followed by something is found in each trie; from its
node a tree grows best first, a node's score being the product of its path's empirical continuation frequencies
(count(child) / the counts of its siblings and it), until the node budget: max_nodes, and at most `spec_factor`
drafts per matched token (a short match is weak evidence), nodes under `min_prob` never. The trie whose tree
promises more accepted tokens (the sum of its scores) proposes.

Deterministic: which tree is proposed depends only on committed text (this row's and the cache's), so
Proposal.q is None and greedy, strict and typical acceptance all stay exact.

    drafter = SuffixDrafter()                     # one per server process: its output cache outlives generations
    speculative_generate(model, drafter, prompts, 128)
"""

from __future__ import annotations

import heapq
import itertools
import math

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.suffix_tree import Node, SuffixTrie

_response_ids = itertools.count()   # unique keys of the outputs in a cache, across every drafter and copy


class OutputCache:
    """The outputs of earlier and concurrent generations in one suffix trie, at most `max_tokens` tokens of them:
    past that the oldest outputs leave (the one still growing stays, however long)."""

    def __init__(self, max_depth: int, max_tokens: int):
        if max_tokens < 0:
            raise DraftheadsError(f"the suffix drafter's output cache holds max_tokens >= 0 tokens, got {max_tokens}")
        self.max_tokens = max_tokens
        self.trie = SuffixTrie(max_depth)

    def add(self, key: int, tokens: list[int]) -> None:
        if self.max_tokens == 0:
            return
        self.trie.extend(key, tokens)
        while self.trie.tokens > self.max_tokens and len(self.trie) > 1:
            oldest = next(iter(self.trie.sequences))
            self.trie.remove(oldest if oldest != key else list(self.trie.sequences)[1])

    def emptied(self) -> "OutputCache":
        """A new, empty cache with the same bounds (a fresh server process)."""
        return OutputCache(self.trie.max_depth, self.max_tokens)


class SuffixDrafter:
    """Trees copied from this request's text and from a cache of every output it has seen (no features, no weights).

    max_depth: the tries' depth, which bounds a match plus the drafts after it; max_match: the longest suffix of
    the text matched; max_nodes: drafts per step; spec_factor: drafts per matched token; min_prob: the lowest
    score a draft may have; max_cached_tokens: the output cache's budget (0: this request's text only)."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_depth: int = 24, max_match: int = 12, max_nodes: int = 16, spec_factor: float = 2.0,
                 min_prob: float = 0.1, max_cached_tokens: int = 8192, outputs: OutputCache | None = None):
        if not 1 <= max_match < max_depth:
            raise DraftheadsError(f"the suffix drafter needs 1 <= max_match < max_depth (room to draft after a "
                                  f"match), got max_match {max_match} and max_depth {max_depth}")
        if max_nodes < 1 or spec_factor <= 0 or not 0 <= min_prob < 1:
            raise DraftheadsError(f"the suffix drafter needs max_nodes >= 1, spec_factor > 0 and min_prob in [0, 1), "
                                  f"got {max_nodes}, {spec_factor} and {min_prob}")
        self.max_depth, self.max_match, self.max_nodes = max_depth, max_match, max_nodes
        self.spec_factor, self.min_prob = spec_factor, min_prob
        self.outputs = outputs or OutputCache(max_depth, max_cached_tokens)
        self.default_tree = DynamicTreeSpec(top_k=max_nodes, depth=max_depth - max_match, total_tokens=max_nodes)
        self.reset()

    def reset(self) -> None:
        """A new request: its own text starts empty; the output cache stays."""
        self.text: list[int] = []
        self.own = SuffixTrie(self.max_depth)
        self.response = next(_response_ids)
        self.device = torch.device("cpu")

    def __copy__(self) -> "SuffixDrafter":
        """Another row's drafter (decoding/decoder.py): its own text, the same output cache."""
        return SuffixDrafter(self.max_depth, self.max_match, self.max_nodes, self.spec_factor, self.min_prob,
                             outputs=self.outputs)

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """next_tokens [1, n]: the prompt (after a reset; its last token is the first one generated), then what
        each step committed; all of it is this request's text, what was generated goes to the output cache too."""
        if next_tokens.shape[0] != 1:
            raise DraftheadsError("the suffix drafter drafts one sequence; the generation loop gives each row a copy")
        tokens = next_tokens[0].tolist()
        generated = tokens if self.text else tokens[-1:]
        self.text += tokens
        self.own.extend(0, tokens)
        self.outputs.add(self.response, generated)
        self.device = next_tokens.device

    @property
    def pending(self) -> int:
        return self.text[-1]

    def propose(self, tree: Tree | DynamicTreeSpec, *, temperature=0.0, top_k=0, top_p=1.0, generator=None) -> Proposal:
        """A tree within `tree`'s depth and node count (a dynamic spec's top_k bounds the children of a node)."""
        limit = tree.top_k if isinstance(tree, DynamicTreeSpec) else tree.num_nodes
        paths, tokens = self.draft(tree.depth, tree.num_nodes - 1, limit)
        drafted, by_path = Tree.from_paths(paths), dict(zip(paths, tokens))
        return Proposal(drafted, torch.tensor([[self.pending, *(by_path[p] for p in drafted.paths)]],
                                              dtype=torch.long, device=self.device))

    def copy_paths(self, depth: int) -> list[list[int]]:
        """The drafted tree's root-to-leaf token paths, best first (what a combination grafts onto a learned tree).
        At least `depth` nodes whatever the match length, as prompt lookup's chain: beside a learned tree, which
        covers the next few tokens anyway, what copying adds is the long runs."""
        paths, tokens = self.draft(depth, self.max_nodes, self.max_nodes, at_least=depth)
        by_path = dict(zip(paths, tokens))
        inner = {p[:-1] for p in paths}  # every node that is some node's parent
        leaves = [p for p in paths if p not in inner]
        return [[by_path[p[:d]] for d in range(1, len(p) + 1)] for p in leaves]

    def copy_budget(self, depth: int) -> int:
        return self.max_nodes

    def draft(self, depth: int, nodes: int, children: int, at_least: int = 0
              ) -> tuple[list[tuple[int, ...]], list[int]]:
        """The best tree of the two tries: its rank paths and their tokens, in the order nodes were chosen."""
        best: tuple[float, list, list] = (0.0, [], [])
        for trie in (self.own, self.outputs.trie):
            node, matched = trie.match(self.text, self.max_match)
            if node is None:
                continue
            budget = min(nodes, max(at_least, math.ceil(self.spec_factor * matched)))
            grown = grow_tree(node, min(depth, trie.max_depth - matched), budget, children, self.min_prob)
            if grown[0] > best[0]:
                best = grown
        return best[1], best[2]


def grow_tree(match: Node, depth: int, nodes: int, children: int, min_prob: float
              ) -> tuple[float, list[tuple[int, ...]], list[int]]:
    """(score, rank paths, tokens): up to `nodes` nodes below `match`, best first by the product of each path's
    continuation frequencies, at most `depth` deep and `children` per node, none scoring under min_prob; the score
    is the sum of the chosen nodes' scores (the drafts expected to be accepted if the frequencies held)."""
    heap: list = []
    tie = itertools.count()

    def offer(node: Node, path: tuple[int, ...], prob: float) -> None:
        total = sum(child.count for child in node.children.values())
        for token, child in node.children.items():
            heapq.heappush(heap, (-prob * child.count / total, next(tie), path, token, child))

    offer(match, (), 1.0)
    kids: dict[tuple[int, ...], int] = {}
    score, paths, tokens = 0.0, [], []
    while heap and len(paths) < nodes:
        negative, _, parent, token, node = heapq.heappop(heap)
        if -negative < min_prob:
            break
        if kids.get(parent, 0) >= children:
            continue
        path = parent + (kids.get(parent, 0),)
        kids[parent] = path[-1] + 1
        score -= negative
        paths.append(path)
        tokens.append(token)
        if len(path) < depth and node.children:
            offer(node, path, -negative)
    return score, paths, tokens
