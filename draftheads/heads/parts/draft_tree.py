"""Growing a draft tree level by level, shared by EAGLE and MTP (and the block-parallel heads' static trees).

A drafter supplies one callback, `expand(nodes, parents, tokens) -> logits [b, len(nodes), V]`:
the draft logits for the children of `nodes` (all at one depth, every ancestor expanded in an
earlier call, so autoregressive drafters can feed them with a tree mask over their own cache).
`parents[i]` and `tokens[:, i]` describe every node created so far; node 0 is the root. Logits are
over the drafter's vocabulary (`vocab`, heads/parts/draft_vocab.py): with a draft vocabulary [b, n, Vd],
so softmax and top-k run over Vd columns, not V (the same result: tokens outside have zero draft
probability), and `vocab` maps the picked columns to target ids.

- static trees: every node of a depth that has children is expanded in one call; its children
  are the draft's top-k (or k draws without replacement from the warped draft distribution).
- EAGLE-2 dynamic trees (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with
  Dynamic Draft Trees"): at each depth expand the top_k frontier nodes by cumulative draft
  log-probability, top_k children each; then keep the best `total_tokens` drafted nodes overall.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

import torch

from draftheads.core.sampling import drawable, pick_children, warp_probs
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.draft_vocab import FULL

Expand = Callable[[list[int], list[int], torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Sampling:
    """How children are chosen: top-k of the draft (greedy), or drawn from the warped draft."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @property
    def sampled(self) -> bool:
        return self.generator is not None and self.temperature > 0


def child_distribution(logits: torch.Tensor, sampling: Sampling, need: int) -> torch.Tensor:
    """[..., V] logits -> [..., V] the distribution children come from.

    Sampled: the draft warped like the target; where top-k/top-p leave fewer than `need`
    tokens, temperature alone (so `need` distinct draws stay exact draws from q). Greedy: softmax.
    """
    if not sampling.sampled:
        return logits.float().softmax(-1)
    probs = warp_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    short = (probs > 0).sum(-1, keepdim=True) < need
    if short.any():
        probs = torch.where(short, warp_probs(logits, sampling.temperature), probs)
    return drawable(probs)


def choose_children(probs: torch.Tensor, k: int, sampling: Sampling) -> torch.Tensor:
    """[b, V] -> [b, k] distinct child tokens in rank order."""
    if not sampling.sampled:
        return torch.topk(probs, k, dim=-1).indices
    picked = pick_children(probs, k, sampling.generator)
    if picked.shape[-1] < k:  # q underflowed to fewer than k tokens: pad with the likeliest others (q = 0)
        rest = probs.scatter(-1, picked, float("-inf"))
        picked = torch.cat([picked, torch.topk(rest, k - picked.shape[-1], dim=-1).indices], dim=-1)
    return picked


def node_depth(parents: list[int], node: int) -> int:
    depth = 0
    while node > 0:
        node, depth = parents[node], depth + 1
    return depth


def lineage(parents: list[int], node: int) -> list[int]:
    """The node and its ancestors up to (not including) the root."""
    out = []
    while node > 0:
        out.append(node)
        node = parents[node]
    return out


def draft_static(tree: Tree, root: torch.Tensor, expand: Expand, sampling: Sampling, vocab=FULL):
    """Fill a static tree: root [b] -> (tokens [b, N], q [b, N, V] or None).

    The rank-r child gets the r-th best token, or with sampling the r-th draw: a sampled tree must have
    no gaps in its sibling ranks (Tree.compacted), or the strict rule cannot account for the skipped draws."""
    tokens = root.new_zeros(root.shape[0], tree.num_nodes)
    tokens[:, 0] = root
    q = None
    for depth in range(tree.depth):
        nodes = [v for v in range(tree.num_nodes) if tree.depths[v] == depth and tree.children[v]]
        logits = expand(nodes, list(tree.parents), tokens)
        for i, node in enumerate(nodes):
            kids = tree.children[node]
            need = max(tree.ranks[c] for c in kids) + 1
            probs = child_distribution(logits[:, i], sampling, need)
            picked = vocab.to_target(choose_children(probs, need, sampling))
            for child in kids:
                tokens[:, child] = picked[:, tree.ranks[child]]
            if sampling.sampled:
                full = vocab.widen_probs(probs)
                if q is None:
                    q = full.new_zeros(*tokens.shape, full.shape[-1])
                q[:, node] = full
    return tokens, q


@dataclass
class Forest:
    """Candidate nodes of a dynamic tree (one sequence). Node 0 is the root."""

    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    ranks: list[int] = field(default_factory=lambda: [0])
    scores: list[float] = field(default_factory=lambda: [0.0])  # cumulative draft log-probability
    tokens: list[int] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)  # by rank

    def add(self, parent: int, token: int, score: float) -> None:
        kids = self.children.setdefault(parent, [])
        kids.append(len(self.parents))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.ranks.append(len(kids) - 1)
        self.scores.append(score)
        self.tokens.append(token)


def grow_dynamic(spec: DynamicTreeSpec, root: int, expand: Expand, sampling: Sampling, vocab=FULL,
                 device=None) -> Forest:
    """Expand the best `top_k` frontier nodes for `spec.depth` levels (the root is level 0)."""
    forest = Forest(tokens=[root])
    frontier = [0]
    for level in range(spec.depth):
        logits = expand(frontier, forest.parents, torch.tensor([forest.tokens], device=device))[0]  # [F, V]
        probs = child_distribution(logits, sampling, spec.top_k)
        picked = choose_children(probs, spec.top_k, sampling)
        logp = probs.gather(-1, picked).log().tolist()
        for i, node in enumerate(frontier):
            for token, lp in zip(vocab.to_target(picked[i]).tolist(), logp[i]):
                forest.add(node, token, forest.scores[node] + lp)
        new = [v for v, d in enumerate(forest.depths) if d == level + 1]
        frontier = sorted(sorted(new, key=lambda v: -forest.scores[v])[: spec.top_k])
    return forest


def select_nodes(forest: Forest, total: int) -> list[int]:
    """The best `total` drafted nodes by cumulative log-probability, closed under parents and
    earlier-ranked siblings (children are tried in rank order, so a kept child needs its elder
    siblings). Best-first from the root; with top-k children that is the plain top-`total`."""
    kept: list[int] = []
    heap = [(-forest.scores[c], c) for c in forest.children.get(0, [])[:1]]
    while heap and len(kept) < total:
        _, node = heapq.heappop(heap)
        kept.append(node)
        follow = forest.children.get(node, [])[:1]  # first child
        siblings = forest.children[forest.parents[node]]
        follow += siblings[forest.ranks[node] + 1 : forest.ranks[node] + 2]  # next sibling
        for nxt in follow:
            heapq.heappush(heap, (-forest.scores[nxt], nxt))
    return kept


def forest_to_tree(forest: Forest, kept: list[int]):
    """Kept forest nodes -> (Tree, tokens [1, N]), node 0 the root."""
    paths = {0: ()}
    for node in sorted(kept, key=lambda v: forest.depths[v]):
        paths[node] = paths[forest.parents[node]] + (forest.ranks[node],)
    tree = Tree.from_paths([paths[v] for v in kept])
    index = {paths[v]: v for v in paths}
    order = [0] + [index[p] for p in tree.paths]
    tokens = torch.tensor([[forest.tokens[v] for v in order]])
    return tree, tokens


def single_root(root: torch.Tensor) -> int:
    """The root token of a dynamic tree, which is built for one sequence at a time."""
    if root.numel() != 1:
        raise ValueError(f"dynamic trees are built for one sequence at a time, got a batch of {root.numel()}")
    return int(root.reshape(-1)[0])


def draft_dynamic(spec: DynamicTreeSpec, root: torch.Tensor, expand: Expand, sampling: Sampling, vocab=FULL):
    """EAGLE-2 dynamic tree for one sequence: root [1] -> (Tree, tokens [1, N], None).

    N = total_tokens drafted nodes + the root (fewer if the candidates run out). q is always None:
    which sampled children survive depends on their drawn values (pruning by score), and then the
    q-based tree rule is biased, while treating every child as a point mass stays exact however the
    children were chosen (tests/decoding: test_value_dependent_pruning_needs_point_masses).
    """
    forest = grow_dynamic(spec, single_root(root), expand, sampling, vocab, root.device)
    tree, tokens = forest_to_tree(forest, select_nodes(forest, spec.total_tokens))
    return tree, tokens.to(root.device), None
