"""The one tree-spec parser: every form, its one-line errors, and the size limits checked before anything is built."""

import time

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import MAX_DEPTH, MAX_NODES, MAX_TOP_K, AutoTreeSpec, DynamicTreeSpec, Tree, parse_tree


def test_every_form_parses_and_answers_depth_and_num_nodes():
    chain = parse_tree("chain:3")
    assert chain.paths == ((0,), (0, 0), (0, 0, 0)) and chain.depth == 3 and chain.num_nodes == 4
    dynamic = parse_tree("dynamic:4,5,20")
    assert dynamic == DynamicTreeSpec(4, 5, 20) and dynamic.depth == 5 and dynamic.num_nodes == 21
    assert parse_tree("static:[(0,), (1,), (0, 0)]").paths == ((0,), (1,), (0, 0))
    assert parse_tree([(0,), (0, 0)]).depth == 2
    assert parse_tree("auto") == AutoTreeSpec(32) and parse_tree("auto:12").num_nodes == 13
    assert parse_tree(None) is None and parse_tree(chain) is chain


@pytest.mark.parametrize("spec", ["chain:0", "chain:x", "dynamic:1,2", "static:x", "static:[(0,), (1, 1)]", "auto:0",
                                  "tree:3", 7])
def test_bad_specs_are_one_line_errors_naming_the_forms(spec):
    with pytest.raises(DraftheadsError, match="bad tree") as info:
        parse_tree(spec)
    assert "\n" not in str(info.value) and "chain:K" in str(info.value)


@pytest.mark.parametrize("spec, what", [
    ("chain:100000", "levels"), (f"chain:{MAX_DEPTH + 1}", "levels"),
    (f"dynamic:{MAX_TOP_K + 1},4,10", "top_k"), (f"dynamic:4,{MAX_DEPTH + 1},10", "levels"),
    (f"dynamic:4,4,{MAX_NODES + 1}", "draft nodes"), (f"auto:{MAX_NODES + 1}", "draft nodes"),
    ("static:" + repr([(0,) * (MAX_DEPTH + 1)]), "levels"), (f"static:[(0,), ({MAX_TOP_K},)]", "children per node"),
    ([(i,) for i in range(MAX_NODES + 1)], "draft nodes"),
])
def test_oversized_trees_are_refused_before_anything_is_built(spec, what):
    started = time.perf_counter()
    with pytest.raises(DraftheadsError, match="too large") as info:
        parse_tree(spec, "eval.tree")
    message = str(info.value)
    assert message.startswith("eval.tree: ") and what in message and "give a smaller tree" in message
    assert time.perf_counter() - started < 1.0  # chain:100000 used to build ~5e9 path entries first


def test_the_limits_themselves_are_allowed():
    assert parse_tree(f"chain:{MAX_DEPTH}").depth == MAX_DEPTH
    assert parse_tree(f"dynamic:{MAX_TOP_K},{MAX_DEPTH},{MAX_NODES}").num_nodes == MAX_NODES + 1
    assert parse_tree(Tree.from_paths([(r,) for r in range(MAX_TOP_K)])).num_nodes == MAX_TOP_K + 1
