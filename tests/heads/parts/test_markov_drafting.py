"""Markov drafting (heads/parts/markov_drafting.py): DDTree's dynamic tree over per-node Markov candidates is the
exact best N nodes, whatever order the candidates are computed in and however many are computed at once."""

import itertools

import torch

import draftheads
from draftheads.core.tree import DynamicTreeSpec
from draftheads.heads.parts.draft_tree import Sampling
from draftheads.heads.parts.markov_drafting import markov_tree
from tests.fixtures import make_target
from tests.heads.batches import perturb


def brute_force_best(model, base: torch.Tensor, root: int, spec: DynamicTreeSpec) -> set[tuple[int, ...]]:
    """The token paths of the best total_tokens nodes among every path of depth <= D whose token at each depth is one
    of its parent's top_k Markov candidates, by summed log-probability (a path scores below its prefix, so the best
    nodes form a tree)."""
    scored = {}

    def grow(path: tuple[int, ...], score: float) -> None:
        depth = len(path)
        if depth == spec.depth:
            return
        log_p = model.markov_logits(base[depth][None], torch.tensor([path[-1] if path else root]))[0].log_softmax(-1)
        top = log_p.topk(spec.top_k)
        for value, column in zip(top.values.tolist(), model.vocab.to_target(top.indices).tolist()):
            scored[path + (column,)] = score + value
            grow(path + (column,), score + value)

    grow((), 0.0)
    best = sorted(scored.items(), key=lambda item: -item[1])[: spec.total_tokens]
    assert best[-1][1] > sorted(scored.values(), reverse=True)[spec.total_tokens]   # no tie at the cut
    return {path for path, _ in best}


def test_the_dynamic_markov_tree_is_the_exact_best_n():
    target = make_target("llama")
    torch.manual_seed(0)
    drafter = draftheads.build_drafter("dspark", target, block_size=3, markov_rank=8, draft_vocab_size=50).eval()
    perturb(drafter, scale=0.2)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(40.0)   # children that depend on their parent's token
        for seed, (k, n) in itertools.product(range(3), [(2, 5), (3, 9), (4, 14)]):
            base = torch.randn(3, 50, generator=torch.Generator().manual_seed(seed)) * 2
            spec = DynamicTreeSpec(top_k=k, depth=3, total_tokens=n)
            proposal = markov_tree(drafter, spec, torch.tensor([7]), base[None], Sampling())
            tokens, tree = proposal.tokens[0].tolist(), proposal.tree
            paths = {tuple(tokens[v] for v in tree.ancestors(node)[1:]) for node in range(1, tree.num_nodes)}
            assert paths == brute_force_best(drafter, base, 7, spec), (seed, k, n)
