"""Tree drafting against a stub drafter whose logits are a fixed random function of the path."""

import torch

from draftheads.core.sampling import warp_probs
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.draft_tree import (
    Sampling,
    child_distribution,
    draft_dynamic,
    draft_static,
    forest_to_tree,
    grow_dynamic,
    select_nodes,
)

VOCAB = 12


def path_logits(path: tuple[int, ...]) -> torch.Tensor:
    """[V] logits that depend only on the token path from the root (inclusive)."""
    seed = sum(t * 31**i for i, t in enumerate(path)) % (2**31)
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def stub_expand(calls: list):
    def expand(nodes, parents, tokens):
        calls.append(list(nodes))
        out = torch.zeros(tokens.shape[0], len(nodes), VOCAB)
        for i, node in enumerate(nodes):
            chain = [node]
            while parents[chain[-1]] >= 0:
                chain.append(parents[chain[-1]])
            for row in range(tokens.shape[0]):
                out[row, i] = path_logits(tuple(tokens[row, v].item() for v in reversed(chain)))
        return out

    return expand


def test_dynamic_tree_expands_the_best_frontier_and_keeps_the_global_best():
    spec, calls = DynamicTreeSpec(top_k=3, depth=4, total_tokens=12), []
    forest = grow_dynamic(spec, 5, stub_expand(calls), Sampling())
    assert len(calls) == spec.depth and calls[0] == [0]
    for level, frontier in enumerate(calls[1:], start=1):  # the top_k of each level by cumulative log-prob
        level_nodes = [v for v, d in enumerate(forest.depths) if d == level]
        assert sorted(frontier) == sorted(sorted(level_nodes, key=lambda v: -forest.scores[v])[: spec.top_k])
    for node in range(1, len(forest.parents)):  # scores are cumulative draft log-probabilities
        parent = forest.parents[node]
        path = []
        v = parent
        while v >= 0:
            path.append(forest.tokens[v])
            v = forest.parents[v]
        logp = path_logits(tuple(reversed(path))).log_softmax(-1)[forest.tokens[node]].item()
        assert abs(forest.scores[node] - forest.scores[parent] - logp) < 1e-5
    kept = select_nodes(forest, spec.total_tokens)
    best = sorted(range(1, len(forest.parents)), key=lambda v: -forest.scores[v])[: spec.total_tokens]
    assert sorted(kept) == sorted(best)
    tree, tokens = forest_to_tree(forest, kept)
    assert tree.num_nodes == spec.total_tokens + 1
    assert list(tree.paths) == sorted(tree.paths, key=lambda p: (len(p), p))
    for node in range(1, tree.num_nodes):  # the child of rank r is the parent's r-th best token
        parent_path = tuple(tokens[0, tree.ancestors(tree.parents[node])].tolist())
        assert tokens[0, node] == torch.topk(path_logits(parent_path), tree.ranks[node] + 1).indices[-1]


def test_sampled_dynamic_tree_keeps_elder_siblings():
    spec = DynamicTreeSpec(top_k=3, depth=3, total_tokens=7)
    sampling = Sampling(temperature=1.5, generator=torch.Generator().manual_seed(0))
    tree, tokens, q = draft_dynamic(spec, torch.tensor([5]), stub_expand([]), sampling)
    assert tree.num_nodes == 8 and tokens.shape == (1, 8)
    assert q is None  # value-dependent pruning: only the point-mass rule is exact
    for node in range(tree.num_nodes):
        kids = tree.children[node]
        assert [tree.ranks[c] for c in kids] == list(range(len(kids)))  # no gaps: elder siblings kept
        if kids:  # children are distinct draws from the warped draft distribution's support
            path = tuple(tokens[0, tree.ancestors(node)].tolist())
            support = warp_probs(path_logits(path), 1.5) > 0
            assert bool(support[tokens[0, list(kids)]].all())
            assert len(set(tokens[0, list(kids)].tolist())) == len(kids)


def test_static_tree_children_by_rank():
    tree = Tree.from_paths([(0,), (2,), (0, 1), (0, 1, 0)])  # gaps: rank 2 without rank 1
    tokens, q = draft_static(tree, torch.tensor([4, 7]), stub_expand([]), Sampling())
    assert q is None and tokens[:, 0].tolist() == [4, 7]
    for row, root in enumerate((4, 7)):
        top = torch.topk(path_logits((root,)), 3).indices
        assert tokens[row, 1] == top[0] and tokens[row, 2] == top[2]
        assert tokens[row, 3] == torch.topk(path_logits((root, tokens[row, 1].item())), 2).indices[1]


def test_sampled_children_fall_back_to_temperature_when_top_k_leaves_too_few():
    logits = torch.randn(2, VOCAB)
    probs = child_distribution(logits, Sampling(temperature=0.7, top_k=2, generator=torch.Generator()), need=3)
    torch.testing.assert_close(probs, warp_probs(logits, 0.7))
    probs = child_distribution(logits, Sampling(temperature=0.7, top_k=4, generator=torch.Generator()), need=3)
    torch.testing.assert_close(probs, warp_probs(logits, 0.7, top_k=4))
