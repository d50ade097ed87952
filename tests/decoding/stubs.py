"""Test doubles implementing the Drafter protocol: random, oracle (the target's own top-k), recording."""

from __future__ import annotations

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.sampling import pick_children, warp_probs
from draftheads.core.tree import Tree


def static(tree) -> Tree:
    """Stubs draft static trees; a dynamic spec becomes a chain of its depth plus rank-1..top_k-1 siblings along
    the chain, cut to total_tokens nodes."""
    if isinstance(tree, Tree):
        return tree
    paths = [(0,) * d for d in range(1, tree.depth + 1)]
    paths += [(0,) * d + (r,) for d in range(tree.depth) for r in range(1, tree.top_k)]
    return Tree.from_paths(paths[: tree.total_tokens])


class RandomDrafter:
    """Uniformly random drafts (a deliberately useless drafter). With `sampled=True` and a temperature,
    children are drawn without replacement from a fixed random distribution q, returned in Proposal.q."""

    def __init__(self, vocab: int, seed: int = 0, sampled: bool = False, tree: Tree | None = None,
                 feature_layers=(-1,)):
        self.vocab, self.seed, self.sampled = vocab, seed, sampled
        self.tree = tree or Tree.chain(3)
        self.feature_layers = tuple(feature_layers)
        g = torch.Generator().manual_seed(seed + 1)
        self.logits = 3 * torch.randn(vocab, generator=g)
        self.reset()

    def reset(self):
        self.generator = torch.Generator().manual_seed(self.seed)
        self.pending = None

    def observe(self, features, next_tokens):
        assert features.shape[:2] == next_tokens.shape
        self.pending = next_tokens[:, -1]

    @property
    def default_tree(self):
        return self.tree

    def propose(self, tree, *, temperature=0.0, top_k=0, top_p=1.0, generator=None):
        tree = static(tree)
        b, n = self.pending.shape[0], tree.num_nodes
        tokens = torch.randint(self.vocab, (b, n), generator=self.generator)
        tokens[:, 0] = self.pending
        if not (self.sampled and temperature > 0 and generator is not None):
            return Proposal(tree, tokens)
        q = warp_probs(self.logits, temperature).expand(b, n, -1).clone()   # full support, whatever the target keeps
        for node, kids in enumerate(tree.children):
            if kids:
                tokens[:, list(kids)] = pick_children(q[:, node], len(kids), generator)
        return Proposal(tree, tokens, q)


class OracleDrafter:
    """Drafts the target's own top-k at every node (rank 0 = the target's greedy choice), so greedy
    acceptance takes whole paths. `noise` replaces each draft by a random token with that probability;
    `swap` swaps the ranks of the top two candidates under a node with that probability."""

    def __init__(self, target, first_token: int, noise: float = 0.0, seed: int = 0, tree: Tree | None = None,
                 swap: float = 0.0):
        self.target, self.first_token, self.noise, self.seed, self.swap = target, first_token, noise, seed, swap
        self.tree = tree or Tree.chain(4)
        self.feature_layers = (-1,)
        self.reset()

    def reset(self):
        self.history: list[int] | None = None
        self.generator = torch.Generator().manual_seed(self.seed)

    def observe(self, features, next_tokens):
        self.history = (self.history or [self.first_token]) + next_tokens[0].tolist()

    @property
    def default_tree(self):
        return self.tree

    @torch.no_grad()
    def propose(self, tree, *, temperature=0.0, top_k=0, top_p=1.0, generator=None):
        tree = static(tree)
        tokens = torch.zeros(1, tree.num_nodes, dtype=torch.long)
        tokens[0, 0] = self.history[-1]
        for depth in range(tree.depth):
            parents = [i for i in range(tree.num_nodes) if tree.depths[i] == depth and tree.children[i]]
            contexts = torch.tensor([self.history[:-1] + tokens[0, tree.ancestors(i)].tolist() for i in parents])
            logits = self.target(input_ids=contexts).logits[:, -1]
            width = max(len(tree.children[i]) for i in parents)
            top = logits.topk(max(width, 2), dim=-1).indices
            if self.swap:
                swap = torch.rand(len(parents), generator=self.generator) < self.swap
                top[swap, :2] = top[swap, :2].flip(-1)
            for row, parent in enumerate(parents):
                for rank, child in enumerate(tree.children[parent]):
                    tokens[0, child] = top[row, rank]
        if self.noise:
            flip = torch.rand(tokens.shape, generator=self.generator) < self.noise
            flip[:, 0] = False
            tokens = torch.where(flip, torch.randint(self.target.config.vocab_size, tokens.shape,
                                                     generator=self.generator), tokens)
        return Proposal(tree, tokens)


class RecordingDrafter(RandomDrafter):
    """A random drafter that keeps everything `observe` was given."""

    def __init__(self, vocab: int, feature_layers=(-1,), **kw):
        super().__init__(vocab, feature_layers=feature_layers, **kw)

    def reset(self):
        super().reset()
        self.features, self.next_tokens = [], []

    def observe(self, features, next_tokens):
        super().observe(features, next_tokens)
        self.features.append(features)
        self.next_tokens.append(next_tokens)
