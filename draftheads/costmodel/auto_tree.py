"""Static draft trees chosen from measured accuracies (the Medusa recipe), as pure functions of a table.

accuracy[d][r] = P(the drafter's rank-r candidate at depth d+1 is the token the target accepts there |
the path down to depth d was accepted). Treating depths as independent, a node with index path
(r_1, ..., r_k) is accepted with probability prod_i accuracy[i-1][r_i], and the expected number of
accepted drafts of a tree is the sum of that over its nodes. A child's value never exceeds its
parent's, so the `budget` best paths always form a tree and taking them greedily is optimal.

The table comes from `GenerationStats.rank_accuracy` of a greedy run with a wide full tree, or from
per-depth top-k accuracies measured in training (`from_topk` turns cumulative top-k into per-rank).
"""

from __future__ import annotations

import heapq

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree


def check_table(accuracy) -> list[list[float]]:
    table = [[float(a) for a in row] for row in accuracy]
    if not table or not all(table) or any(not 0 <= a <= 1 for row in table for a in row):
        raise DraftheadsError("the accuracy table must be non-empty rows (one per depth) of probabilities in [0, 1]")
    if any(sum(row) > 1 + 1e-6 for row in table):
        raise DraftheadsError("each depth's per-rank accuracies must sum to at most 1; convert cumulative top-k "
                              "with from_topk")
    return table


def from_topk(topk_accuracy) -> list[list[float]]:
    """Cumulative top-k accuracies [d][k] (top-1, top-2, ...) -> per-rank accuracies [d][r]."""
    return [[row[0]] + [max(0.0, b - a) for a, b in zip(row, row[1:])] for row in topk_accuracy]


def path_value(accuracy: list[list[float]], path: tuple[int, ...]) -> float:
    """Probability that the node with this index path is accepted."""
    value = 1.0
    for depth, rank in enumerate(path):
        value *= accuracy[depth][rank] if rank < len(accuracy[depth]) else 0.0
    return value


def auto_tree(accuracy, budget: int) -> Tree:
    """The tree of at most `budget` draft nodes (root excluded) with the largest expected accepted length."""
    if budget < 1:
        raise DraftheadsError(f"the tree budget must be at least 1 draft node, got {budget}")
    table = check_table(accuracy)
    # max-heap of candidates (value, depth, path): ties go to shallower, then lower-rank paths,
    # so a parent always leaves the heap before its equally valued children
    heap = [(-table[0][r], 1, (r,)) for r in range(len(table[0]))]
    heapq.heapify(heap)
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < budget:
        negative, depth, path = heapq.heappop(heap)
        if -negative <= 0:
            break
        chosen.append(path)
        if depth < len(table):
            for r in range(len(table[depth])):
                heapq.heappush(heap, (negative * table[depth][r], depth + 1, path + (r,)))
    if not chosen:
        raise DraftheadsError("every accuracy in the table is 0: the drafter never matched the target, no tree helps")
    return Tree.from_paths(chosen)


def expected_accepted(tree: Tree, accuracy) -> float:
    """Expected drafts accepted per step under the independence model (tau is 1 + this)."""
    table = check_table(accuracy)
    return sum(path_value(table, path) for path in tree.paths if len(path) <= len(table))
