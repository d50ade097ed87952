"""Draft trees: index paths -> parents, depths, ranks and children; the one tree-spec parser.

A tree is given by index paths, the form Medusa and EAGLE use: (0,) is the top-1 child of
the root, (0, 1) the top-2 child of that node, and so on. Node 0 is always the root (the
pending token the target has not seen yet); drafted nodes are 1..n, ordered by depth then
path. A chain of K drafts is the tree [(0,), (0, 0), ...]: same code path everywhere.

What users write (`--tree`, a recipe's `default_tree` or `eval.tree`, the API's `tree=`) is read by
`parse_tree`, the one parser: a static `Tree`, an EAGLE-2 `DynamicTreeSpec` the drafter grows each
step, or an `AutoTreeSpec` that `draftheads eval` fits to each drafter. Tree and DynamicTreeSpec
both answer `depth` (draft levels) and `num_nodes` (root included; at most, for a dynamic tree).

A tree here is its shape alone, in plain Python: settings that name one are checked without torch (the CLI's
flags among them). The tensors verification indexes with are built from it in decoding/tree_tensors.py.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from draftheads.core.errors import DraftheadsError

Path = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Tree:
    """An immutable tree shape. Node 0 is the root; `paths[i]` is node i+1's index path."""

    paths: tuple[Path, ...]
    parents: tuple[int, ...] = field(init=False)   # parents[i] = parent of node i (root: -1)
    depths: tuple[int, ...] = field(init=False)    # depths[i] = depth of node i (root: 0)
    ranks: tuple[int, ...] = field(init=False)     # ranks[i] = sibling rank of node i (root: 0)
    children: tuple[tuple[int, ...], ...] = field(init=False)  # children of each node, by rank

    def __post_init__(self):
        index = {(): 0}
        parents, depths, ranks = [-1], [0], [0]
        for i, path in enumerate(self.paths, start=1):
            if path[:-1] not in index:
                raise ValueError(f"tree path {path} has no parent path {path[:-1]} in the tree")
            index[path] = i
            parents.append(index[path[:-1]])
            depths.append(len(path))
            ranks.append(path[-1])
        children = [[] for _ in parents]
        for node in range(1, len(parents)):
            children[parents[node]].append(node)
        for kids in children:
            kids.sort(key=lambda n: ranks[n])
        object.__setattr__(self, "parents", tuple(parents))
        object.__setattr__(self, "depths", tuple(depths))
        object.__setattr__(self, "ranks", tuple(ranks))
        object.__setattr__(self, "children", tuple(tuple(c) for c in children))

    @classmethod
    def from_paths(cls, paths) -> "Tree":
        clean = sorted({tuple(int(i) for i in p) for p in paths}, key=lambda p: (len(p), p))
        if any(len(p) == 0 or min(p) < 0 for p in clean):
            raise ValueError("tree paths must be non-empty tuples of non-negative ranks")
        return cls(tuple(clean))

    @classmethod
    def chain(cls, k: int) -> "Tree":
        return cls.from_paths([(0,) * d for d in range(1, k + 1)])

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.parents)

    @property
    def depth(self) -> int:
        """Draft levels below the root (0 for the root alone)."""
        return max(self.depths)

    @property
    def is_chain(self) -> bool:
        return all(len(c) <= 1 for c in self.children)

    def compacted(self) -> "Tree":
        """The same tree with every rank replaced by the node's position among its siblings: ((0,), (2,)) ->
        ((0,), (1,)). Sampled children are the first draws without replacement, one per sibling present, so
        a tree drafted by sampling must have no gaps in its sibling ranks (the strict rule removes exactly the
        siblings before each child from q)."""
        if all(self.ranks[child] == i for kids in self.children for i, child in enumerate(kids)):
            return self
        paths = {0: ()}
        for node in range(1, self.num_nodes):  # ordered by depth: a parent comes before its children
            parent = self.parents[node]
            paths[node] = paths[parent] + (self.children[parent].index(node),)
        return Tree.from_paths(paths[v] for v in range(1, self.num_nodes))

    def ancestors(self, node: int) -> list[int]:
        """Root-to-node list of node indices, node included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    @functools.cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_nodes) if not self.children[i])


@dataclass(frozen=True)
class DynamicTreeSpec:
    """EAGLE-2 dynamic tree: expand the top_k children of the best nodes for `depth` levels by
    cumulative draft log-probability, then keep the best `total_tokens` nodes."""

    top_k: int
    depth: int
    total_tokens: int

    @property
    def num_nodes(self) -> int:
        """The most nodes a proposal can have, root included (fewer when candidates run out)."""
        return self.total_tokens + 1


AUTO_BUDGET = 32  # draft nodes of `--tree auto`
# Far beyond any tree worth verifying in one forward, and small enough that building one costs nothing.
MAX_DEPTH = 64
MAX_NODES = 1024
MAX_TOP_K = 64
MAX_SPEC_CHARS = 100_000


@dataclass(frozen=True)
class AutoTreeSpec:
    """A static tree of at most `budget` draft nodes that `draftheads eval` fits to each drafter's measured
    per-depth, per-rank accuracies (costmodel/auto_tree.py); no drafter proposes it directly.
    objective 'speed': the highest predicted tokens per second on this machine (costmodel/cost_model.py);
    'tau': the most tokens per forward, all `budget` nodes used."""

    budget: int = AUTO_BUDGET
    objective: str = "speed"

    @property
    def num_nodes(self) -> int:
        return self.budget + 1


TreeSpec = Tree | DynamicTreeSpec | AutoTreeSpec
SPEC_FORMS = "chain:K, dynamic:TOPK,DEPTH,TOTAL, static:PATHS, auto[:NODES] or auto:tau[:NODES]"


def parse_tree(spec, setting: str | None = None) -> TreeSpec | None:
    """A tree from what users write: None, a Tree or spec, 'chain:K', 'dynamic:TOPK,DEPTH,TOTAL',
    'static:[(0,), (0, 0), ...]', 'auto', 'auto:NODES', 'auto:tau', 'auto:tau:NODES', or a list of index paths.

    A spec that is not one of these, or is larger than the limits (MAX_DEPTH levels, MAX_NODES
    draft nodes, MAX_TOP_K children per node), is a one-line DraftheadsError (naming `setting`,
    e.g. 'head.default_tree', when given); the limits are checked before anything is built."""
    if spec is None:
        return None
    try:
        tree = spec if isinstance(spec, (Tree, DynamicTreeSpec, AutoTreeSpec)) else _parse(spec)
        check_limits(tree)
    except TooLarge as err:
        where = f"{setting}: " if setting else ""
        raise DraftheadsError(f"{where}tree {_shown(spec)} is too large: {err}; give a smaller tree") from None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        where = f"{setting}: " if setting else ""
        raise DraftheadsError(f"{where}bad tree {_shown(spec)}: {err}; use {SPEC_FORMS}") from None
    return tree


class TooLarge(ValueError):
    """A tree spec beyond MAX_DEPTH, MAX_NODES or MAX_TOP_K."""


def check_limits(tree: TreeSpec) -> None:
    if isinstance(tree, DynamicTreeSpec):
        _at_most(tree.top_k, MAX_TOP_K, "children per node (top_k)")
    if not isinstance(tree, AutoTreeSpec):  # an auto tree's depth is fitted later, within MAX_DEPTH
        _at_most(tree.depth, MAX_DEPTH, "levels")
    _at_most(tree.num_nodes - 1, MAX_NODES, "draft nodes")
    if isinstance(tree, Tree):
        _at_most(max(tree.ranks) + 1, MAX_TOP_K, "children per node")


def _shown(spec) -> str:
    text = (repr(spec) if isinstance(spec, str)
            else type(spec).__name__ if isinstance(spec, (Tree, DynamicTreeSpec, AutoTreeSpec)) else "of index paths")
    return text if len(text) <= 80 else text[:77] + "...'"


def _parse(spec) -> TreeSpec:
    if not isinstance(spec, str):
        return _static(spec)
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(f"longer than {MAX_SPEC_CHARS:,} characters")
    kind, _, args = spec.partition(":")
    numbers = [int(p) for p in args.split(",") if p.strip().isdigit() and int(p) > 0] if args else []
    if kind == "chain" and len(numbers) == 1 and "," not in args:
        return Tree.chain(_at_most(numbers[0], MAX_DEPTH, "levels"))
    if kind == "dynamic" and len(numbers) == 3 and len(args.split(",")) == 3:
        return DynamicTreeSpec(*numbers)
    if kind == "static":
        try:
            paths = ast.literal_eval(args)
        except (ValueError, SyntaxError):
            raise ValueError("PATHS must be a list of index tuples like [(0,), (1,), (0, 0)]") from None
        return _static(paths)
    if kind == "auto":
        objective, _, budget = args.partition(":") if args.startswith("tau") else ("speed", "", args)
        if objective in ("speed", "tau") and (not budget or (budget.isdigit() and int(budget) > 0)):
            return AutoTreeSpec(int(budget) if budget else AUTO_BUDGET, objective)
    raise ValueError("not a tree spec")


def _static(paths) -> Tree:
    """Tree.from_paths, after checking the paths are few, short and narrow enough to build."""
    paths = list(paths)
    _at_most(len(paths), MAX_NODES, "draft nodes")
    for path in paths:
        _at_most(len(path), MAX_DEPTH, "levels")
        _at_most(max(path, default=0) + 1, MAX_TOP_K, "children per node")
    return Tree.from_paths(paths)


def _at_most(n: int, limit: int, what: str) -> int:
    if n > limit:
        raise TooLarge(f"{n:,} {what}, more than the {limit} a tree may have")
    return n
