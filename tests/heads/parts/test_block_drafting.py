"""Dynamic trees of the block-parallel drafters (DFlash, P-EAGLE): the exact best nodes over per-slot candidates, as
DDTree defines them, checked against brute force, against EAGLE-2's frontier, and in the loop against plain decoding."""

import itertools

import pytest
import torch

import draftheads
from draftheads.core.tree import DynamicTreeSpec
from draftheads.decoding.generate import speculative_generate
from draftheads.heads.parts.block_drafting import tree_from_slots
from draftheads.heads.parts.draft_tree import Sampling, draft_dynamic, node_depth
from draftheads.heads.parts.draft_vocab import FULL
from tests.decoding.test_greedy import plain, prompt_ids, target

ROOT = 99


def node_paths(tree, tokens: torch.Tensor) -> set[tuple[int, ...]]:
    """Every drafted node as its token path from the root (root left out)."""
    return {tuple(tokens[0, n].item() for n in tree.ancestors(node)[1:]) for node in range(1, tree.num_nodes)}


def path_score(logp: torch.Tensor, path: tuple[int, ...]) -> float:
    """Summed log-probability of a token path under per-depth log-probabilities logp [D, V]."""
    return sum(float(logp[depth, token]) for depth, token in enumerate(path))


def brute_force(slots: torch.Tensor, spec: DynamicTreeSpec) -> set[tuple[int, ...]]:
    """The best total_tokens paths of depth <= depth over each depth's top_k tokens, by summed log-probability."""
    logp = slots.float().log_softmax(-1)
    candidates = slots.topk(spec.top_k, -1).indices.tolist()
    paths = [p for d in range(1, spec.depth + 1) for p in itertools.product(*candidates[:d])]
    return set(sorted(paths, key=lambda p: -path_score(logp, p))[: spec.total_tokens])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top_k, depth, total", [(2, 3, 5), (3, 4, 12), (4, 3, 30), (5, 5, 60)])
def test_a_dynamic_tree_is_the_exact_best_nodes_over_the_slots_candidates(seed, top_k, depth, total):
    slots = torch.randn(1, depth, 16, generator=torch.Generator().manual_seed(seed)) * 2
    spec = DynamicTreeSpec(top_k, depth, total)
    proposal = tree_from_slots(spec, torch.tensor([ROOT]), slots, Sampling(), FULL)
    assert node_paths(proposal.tree, proposal.tokens) == brute_force(slots[0], spec)
    assert proposal.tokens[0, 0] == ROOT and proposal.q is None
    assert proposal.tree.num_nodes == min(total, sum(top_k ** d for d in range(1, depth + 1))) + 1


def test_it_keeps_what_eagle2s_frontier_cannot_reach():
    """Depths 1 and 2 nearly tied between two tokens, depth 3 certain: the frontier of 2 gives depth-3 children only
    to the two best depth-2 nodes and spends the rest of its 10 nodes on their hopeless second children, while the
    exact tree takes the certain child of every depth-2 node."""
    slots = torch.full((1, 3, 8), -20.0)
    slots[0, :2, :2] = torch.tensor([1.0, 0.95])
    slots[0, 2, 5] = 10.0
    spec = DynamicTreeSpec(2, 3, 10)
    proposal = tree_from_slots(spec, torch.tensor([ROOT]), slots, Sampling(), FULL)
    exact = node_paths(proposal.tree, proposal.tokens)
    assert {(a, b, 5) for a in (0, 1) for b in (0, 1)} <= exact

    expand = lambda nodes, parents, tokens: slots[:, [node_depth(parents, node) for node in nodes]]
    tree, tokens, _ = draft_dynamic(spec, torch.tensor([ROOT]), expand, Sampling(), FULL)
    frontier = node_paths(tree, tokens)
    assert (1, 1, 5) not in frontier
    logp = slots[0].log_softmax(-1)
    assert sum(path_score(logp, p) for p in exact) > sum(path_score(logp, p) for p in frontier)


@pytest.mark.parametrize("kind, cfg", [("dflash", {"block_size": 4}), ("peagle", {"depths": 3})])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_with_a_dynamic_block_tree_matches_plain(kind, cfg, family):
    model = target(family)
    drafter = draftheads.build_drafter(kind, model, **cfg)
    out = speculative_generate(model, drafter, prompt_ids(), 24, tree="dynamic:3,3,10", eos_token_id=[])
    assert out.tokens.tolist() == plain(family, "sdpa", 40).tokens[:, :24].tolist()
