"""A Tree's shape (core/tree.py, plain Python) as the tensors verification and the acceptance rules index with.

Each is built once per tree and kept while the tree lives: a static tree is verified every step, and building its
[N, N] ancestor matrix node by node each time would add to every step.

    mask = attention_mask(tree, prefix_len, torch.bfloat16, device)   # [1, 1, N, prefix_len + N]
"""

from __future__ import annotations

import functools
import weakref

import torch

from draftheads.core.tree import Tree

_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tree -> {view name: tensor}; freed with the tree


def _once_per_tree(build):
    @functools.wraps(build)
    def view(tree: Tree) -> torch.Tensor:
        built = _BUILT.setdefault(tree, {})
        if build.__name__ not in built:
            built[build.__name__] = build(tree)
        return built[build.__name__]
    return view


@_once_per_tree
def ancestor_matrix(tree: Tree) -> torch.Tensor:
    """[N, N] bool: row i sees column j iff j is i or an ancestor of i."""
    m = torch.zeros(tree.num_nodes, tree.num_nodes, dtype=torch.bool)
    for i in range(tree.num_nodes):
        m[i, tree.ancestors(i)] = True
    return m


@_once_per_tree
def depth_tensor(tree: Tree) -> torch.Tensor:
    """[N] depth of each node (root: 0)."""
    return torch.tensor(tree.depths, dtype=torch.long)


@_once_per_tree
def retrieve_indices(tree: Tree) -> torch.Tensor:
    """[num_leaves, depth + 1] node indices of each root-to-leaf path, padded with -1."""
    out = torch.full((len(tree.leaves), tree.depth + 1), -1, dtype=torch.long)
    for row, leaf in enumerate(tree.leaves):
        path = tree.ancestors(leaf)
        out[row, : len(path)] = torch.tensor(path)
    return out


@_once_per_tree
def parent_tensor(tree: Tree) -> torch.Tensor:
    """[N] parent of each node (root: -1)."""
    return torch.tensor(tree.parents, dtype=torch.long)


@_once_per_tree
def children_table(tree: Tree) -> torch.Tensor:
    """[N, W] children of each node by sibling order, padded with -1 (W = widest node, at least 1)."""
    width = max(1, max(len(c) for c in tree.children))
    out = torch.full((tree.num_nodes, width), -1, dtype=torch.long)
    for node, kids in enumerate(tree.children):
        out[node, : len(kids)] = torch.tensor(kids, dtype=torch.long)
    return out


def attention_mask(tree: Tree, prefix_len: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """[1, 1, N, prefix_len + N] additive mask: 0 where visible, dtype-min elsewhere.

    Every node sees the whole prefix (the KV cache) and its own ancestors.
    """
    # built where it is used: no host-to-device copy of a [N, prefix + N] mask every step
    ancestors = ancestor_matrix(tree).to(device)
    visible = torch.cat([torch.ones(tree.num_nodes, prefix_len, dtype=torch.bool, device=device), ancestors], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def position_ids(tree: Tree, prefix_len: int, device=None) -> torch.Tensor:
    """[1, N] positions prefix_len + depth."""
    return (depth_tensor(tree) + prefix_len)[None].to(device)
