"""Greedy and typical acceptance: hand-built cases and behaviour; rule equivalences at temperature 0."""

from __future__ import annotations

import pytest
import torch

from draftheads.core.sampling import warp_probs
from draftheads.core.tree import Tree
from draftheads.decoding.accept import RULES, accept, accept_greedy, accept_typical, longest_path, typical_threshold
from draftheads.decoding.settings import RULE_NAMES
from draftheads.decoding.tree_tensors import parent_tensor
from tests.decoding.test_strict import chi2_pvalue

TREE = Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (1, 0, 0)])   # nodes: 1=(0,) 2=(1,) 3=(0,0) 4=(1,0) 5=(1,0,0)
V = 6


def peaked(tokens_next: list[int], mass: float = 0.97) -> torch.Tensor:
    """[1, N, V]: after node i the target puts `mass` on tokens_next[i]."""
    p = torch.full((1, len(tokens_next), V), (1 - mass) / (V - 1))
    for i, t in enumerate(tokens_next):
        p[0, i, t] = mass
    return p


def test_longest_path_prefers_the_deeper_branch_and_the_first_on_ties():
    ok = torch.tensor([[True, True, True, False, True, True]])
    path, n = longest_path(TREE, ok)
    assert path.tolist() == [[0, 2, 4, 5]] and n.tolist() == [3]
    ok = torch.tensor([[True, True, True, True, True, False]])      # (0,0) and (1,0) both reach depth 2
    path, n = longest_path(TREE, ok)
    assert path.tolist() == [[0, 1, 3, -1]] and n.tolist() == [2]


def test_greedy_walks_the_argmax_branch():
    tokens = torch.tensor([[0, 4, 2, 3, 5, 1]])
    # argmax after root = 2 (node 2), after node 2 = 5 (node 4), after node 4 = 0 (node 5 has 1: rejected)
    p = peaked([2, 0, 0, 0, 0, 0, 0])[:, :6]
    p[0, 2] = peaked([5] * 6)[0, 0]
    p[0, 4] = peaked([0] * 6)[0, 0]
    result = accept_greedy(TREE, tokens, p)
    assert (result.path.tolist() == [[0, 2, 4, -1]] and result.num_accepted.tolist() == [2]
            and result.next_token.tolist() == [0])


def test_typical_uniform_target_accepts_everything():
    tokens = torch.randint(V, (4, TREE.num_nodes), generator=torch.Generator().manual_seed(0))
    p = torch.full((4, TREE.num_nodes, V), 1 / V)
    result = accept_typical(TREE, tokens, p, torch.Generator().manual_seed(0))
    assert result.num_accepted.tolist() == [TREE.depth] * 4


def test_typical_peaked_target_rejects_mismatches_and_takes_matches():
    tokens = torch.tensor([[0, 4, 2, 3, 5, 1]])
    p = peaked([2, 0, 5, 0, 1, 0])         # matches: node 2 (token 2 after root), node 4 (5 after node 2), node 5 (1)
    result = accept_typical(TREE, tokens, p, torch.Generator().manual_seed(0))
    assert result.path.tolist() == [[0, 2, 4, 5]]
    p = peaked([3, 0, 0, 0, 0, 0])         # nothing matches at depth 1
    assert accept_typical(TREE, tokens, p, torch.Generator().manual_seed(0)).num_accepted.tolist() == [0]


@pytest.mark.parametrize("knob", ["epsilon", "delta"])
def test_typical_acceptance_shrinks_as_epsilon_or_delta_grows(knob):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(V, (2000, TREE.num_nodes), generator=g)
    p = (2 * torch.randn(2000, TREE.num_nodes, V, generator=g)).softmax(-1)
    values = [0.01, 0.05, 0.09, 0.2, 0.5]
    counts = []
    for value in values:
        kw = {"epsilon": 0.09, "delta": 0.3} | {knob: value}
        assert (typical_threshold(p, **kw) <= typical_threshold(p, **(kw | {knob: value * 1.5}))).all()
        counts.append(accept_typical(TREE, tokens, p, g, **kw).num_accepted)
    for looser, stricter in zip(counts, counts[1:]):
        assert (stricter <= looser).all()
    assert counts[0].sum() > counts[-1].sum()


def test_typical_next_token_is_sampled_from_p_at_the_last_accepted_node():
    rows = 20_000
    tokens = torch.tensor([[0, 4, 2, 3, 5, 1]]).expand(rows, -1)
    p = peaked([2, 0, 5, 0, 1, 0], mass=0.7).expand(rows, -1, -1).clone()
    p[:, 5] = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.25, 0.15])   # after the deepest node (5)
    result = accept_typical(TREE, tokens, p, torch.Generator().manual_seed(0))
    assert (result.num_accepted == 3).all()
    assert chi2_pvalue(torch.bincount(result.next_token, minlength=V), p[0, 5]) > 1e-4


@pytest.mark.parametrize("rule", ["strict", "typical"])
def test_every_rule_is_greedy_at_temperature_zero(rule):
    g = torch.Generator().manual_seed(2)
    logits = 3 * torch.randn(500, TREE.num_nodes, V, generator=g)
    parents = parent_tensor(TREE).clamp(min=0)[None].expand(500, -1)
    best = logits.argmax(-1).gather(1, parents)                            # the parent's argmax, per node
    chosen = torch.randint(2, (500, TREE.num_nodes), generator=g).gather(1, parents)  # which sibling is right
    wrong = (best + torch.randint(1, V, best.shape, generator=g)) % V
    tokens = torch.where(chosen == torch.tensor(TREE.ranks), best, wrong)  # at most one right sibling
    p = warp_probs(logits, temperature=0.0)
    expected = accept_greedy(TREE, tokens, p)
    got = accept(rule, TREE, tokens, p, None, g)
    assert torch.equal(got.path, expected.path) and torch.equal(got.next_token, expected.next_token)
    assert expected.num_accepted.float().mean() > 0.5     # the case is not trivial


def test_typical_respects_top_k():
    """A draft outside the warped target's top-k has probability 0 and is never accepted."""
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5]])
    logits = torch.tensor([0.0, 1.0, 0.9, 0.8, 0.7, 0.6]).expand(1, TREE.num_nodes, -1)
    loose = accept_typical(TREE, tokens, warp_probs(logits, 1.0), torch.Generator(), epsilon=0.09, delta=0.3)
    tight = accept_typical(TREE, tokens, warp_probs(logits, 1.0, top_k=1), torch.Generator(), epsilon=0.09, delta=0.3)
    assert loose.num_accepted.item() > 0 and tight.num_accepted.item() == 1   # only token 1 (node 1) survives


def test_the_rules_settings_name_are_the_rules_that_run():
    assert tuple(RULES) == RULE_NAMES
