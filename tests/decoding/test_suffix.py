"""Suffix decoding: the counting suffix trie, trees grown from continuation frequencies, an output cache shared
across requests and rows, bounded; exact under every rule (greedy and batches in test_greedy / test_batch)."""

from __future__ import annotations

import copy

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.suffix import OutputCache, SuffixDrafter, grow_tree
from draftheads.decoding.suffix_tree import SuffixTrie
from tests.decoding.stubs import RandomDrafter
from tests.decoding.test_greedy import plain, prompt_ids, target
from tests.margins import at_least


def counts(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    """Every path of the trie and its count."""
    out, stack = {}, [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[path + (token,)] = child.count
            stack.append((path + (token,), child))
    return out


def substring_counts(texts: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    """By hand: how often each token string of length <= depth occurs in the texts."""
    out: dict[tuple[int, ...], int] = {}
    for text in texts:
        for start in range(len(text)):
            for end in range(start + 1, min(len(text), start + depth) + 1):
                key = tuple(text[start:end])
                out[key] = out.get(key, 0) + 1
    return out


def test_trie_counts_every_substring_grown_token_by_token_and_forgets_a_removed_sequence():
    a, b = [1, 2, 3, 1, 2, 4, 1, 2, 3, 3], [2, 3, 1, 2, 5]
    trie = SuffixTrie(max_depth=4)
    trie.extend("a", a[:3])
    trie.extend("b", b)
    for token in a[3:]:
        trie.extend("a", [token])
    assert counts(trie) == substring_counts([a, b], 4) and trie.tokens == len(a) + len(b)
    trie.remove("a")
    assert counts(trie) == substring_counts([b], 4) and trie.root.count == len(b) and list(trie.sequences) == ["b"]
    trie.remove("b")
    assert trie.root.children == {} and trie.root.count == 0 and trie.tokens == 0


def test_match_is_the_longest_suffix_that_was_followed_before():
    trie = SuffixTrie(max_depth=8)
    trie.extend(0, [7, 1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3])
    node, length = trie.match(trie.sequences[0])
    assert length == 3 and set(node.children) == {9}       # "1 2 3" went on with 9 once; its own end has nothing yet
    node, length = trie.match([4, 4, 5, 2, 3])
    assert length == 3 and set(node.children) == {8}
    assert trie.match([4, 4, 6]) == (None, 0)
    assert trie.match(trie.sequences[0], max_length=2)[1] == 2


def drafter_after(text: list[int], **kw) -> SuffixDrafter:
    drafter = SuffixDrafter(**kw)
    drafter.observe(torch.empty(1, len(text), 0), torch.tensor([text]))
    return drafter


def proposed(drafter: SuffixDrafter, tree=Tree.chain(6)) -> dict[tuple[int, ...], int]:
    proposal = drafter.propose(tree)
    assert proposal.q is None and proposal.tokens[0, 0] == drafter.pending
    return dict(zip(proposal.tree.paths, proposal.tokens[0, 1:].tolist()))


def test_tree_branches_by_frequency_and_its_size_follows_the_match_length():
    # "1 2 3" went on with "9 8" once and "7 6" twice: the more frequent branch ranks first, both are drafted
    text = [1, 2, 3, 9, 8, 0, 1, 2, 3, 7, 6, 0, 1, 2, 3, 7, 6, 5, 1, 2, 3]
    assert proposed(drafter_after(text, spec_factor=2.0), Tree.chain(6)) == {
        (0,): 7, (1,): 9, (0, 0): 6, (1, 0): 8, (0, 0, 0): 0, (0, 0, 1): 5}
    # at one draft per matched token the three matched tokens buy three drafts, the most likely ones
    assert proposed(drafter_after(text, spec_factor=1.0), Tree.chain(6)) == {(0,): 7, (1,): 9, (0, 0): 6}
    # a dynamic spec bounds depth, nodes and children per node
    assert proposed(drafter_after(text, spec_factor=4.0), DynamicTreeSpec(top_k=1, depth=2, total_tokens=8)) == {
        (0,): 7, (0, 0): 6}


def test_unlikely_continuations_are_not_drafted():
    text = [1, 2] + [3, 1, 2] * 9 + [4, 1, 2]     # "1 2" went on with 3 nine times, with 4 once
    assert list(proposed(drafter_after(text, min_prob=0.2, spec_factor=3.0)).values()) == [3, 1, 2, 3, 1, 2]
    assert 4 in proposed(drafter_after(text, min_prob=0.05, spec_factor=8.0), DynamicTreeSpec(4, 3, 8)).values()


def test_grow_tree_scores_are_path_products_of_frequencies():
    trie = SuffixTrie(max_depth=6)
    for key, text in enumerate([[1, 5, 6], [1, 5, 7], [1, 5, 7], [1, 8, 0]]):
        trie.extend(key, text)
    score, paths, tokens = grow_tree(trie.root.children[1], depth=2, nodes=10, children=10, min_prob=0.0)
    assert tokens == [5, 7, 8, 6, 0] and paths == [(0,), (0, 0), (1,), (0, 1), (1, 0)]
    assert score == pytest.approx(0.75 + 0.5 + 0.25 + 0.25 + 0.25)


def test_an_earlier_request_s_output_is_drafted_in_a_later_one():
    drafter = SuffixDrafter()
    drafter.observe(torch.empty(1, 3, 0), torch.tensor([[40, 41, 10]]))          # prompt; 10 generated first
    drafter.observe(torch.empty(1, 6, 0), torch.tensor([[11, 12, 13, 14, 15, 16]]))
    drafter.reset()                                                                # a new request, new prompt
    drafter.observe(torch.empty(1, 4, 0), torch.tensor([[50, 51, 11, 12]]))
    assert list(proposed(drafter).values()) == [13, 14, 15, 16]                     # "11 12" matched: 2 x 2 drafts
    alone = SuffixDrafter(max_cached_tokens=0)
    alone.observe(torch.empty(1, 4, 0), torch.tensor([[50, 51, 11, 12]]))
    assert proposed(alone) == {}


def test_rows_share_the_cache_and_the_oldest_outputs_leave_past_its_budget():
    drafter = SuffixDrafter(outputs=OutputCache(max_depth=24, max_tokens=10))
    row = copy.copy(drafter)
    assert row.outputs is drafter.outputs and row.text is not drafter.text
    drafter.observe(torch.empty(1, 2, 0), torch.tensor([[1, 2]]))
    row.observe(torch.empty(1, 2, 0), torch.tensor([[3, 4]]))
    drafter.observe(torch.empty(1, 5, 0), torch.tensor([[5, 6, 7, 8, 9]]))
    row.observe(torch.empty(1, 5, 0), torch.tensor([[15, 16, 17, 18, 19]]))       # 12 tokens: the oldest goes
    assert list(drafter.outputs.trie.sequences.values()) == [[4, 15, 16, 17, 18, 19]]
    with pytest.raises(DraftheadsError, match="max_match"):
        SuffixDrafter(max_match=24, max_depth=24)
    with pytest.raises(DraftheadsError, match="max_tokens"):
        SuffixDrafter(max_cached_tokens=-1)


@pytest.mark.trains
def test_suffix_decoding_speeds_up_a_repetitive_generation_and_a_repeated_request():
    """The tiny llama's greedy text repeats itself; asked the same again, the whole answer is in the cache."""
    drafter = SuffixDrafter()
    first = speculative_generate(target("llama"), drafter, prompt_ids(), 40, eos_token_id=[])
    again = speculative_generate(target("llama"), drafter, prompt_ids(), 40, eos_token_id=[])
    assert first.tokens.tolist() == again.tokens.tolist() == plain("llama", "sdpa", 40).tokens.tolist()
    at_least(first.stats.tau, 1.5, "tau, first request")   # 1.95 under every kernel setting tried
    assert again.stats.tau > first.stats.tau and again.stats.steps <= 10


def test_a_combination_grafts_every_branch_of_the_suffix_tree_onto_the_learned_one():
    drafter = CombinedDrafter(RandomDrafter(50, tree=Tree.chain(2)), SuffixDrafter(spec_factor=2.0), lookup_depth=4)
    drafter.reset()
    text = [1, 2, 3, 9, 8, 0, 5, 1, 2, 3, 7, 6, 0, 4, 1, 2, 3]      # "1 2 3" went on with "9 8 0" and "7 6 0"
    drafter.observe(torch.zeros(1, len(text), 0), torch.tensor([text]))
    proposal = drafter.propose(Tree.chain(2))
    tokens = proposal.tokens[0].tolist()
    paths = {tuple(tokens[n] for n in proposal.tree.ancestors(node)[1:]) for node in range(proposal.tree.num_nodes)}
    assert {(7, 6, 0), (9, 8, 0)} <= paths and proposal.q is None and tokens[0] == 3
    assert drafter.copy_nodes == 16 and proposal.tree.num_nodes <= 1 + 2 + 6


def test_a_switch_verifies_the_suffix_tree_alone_as_deep_as_suffix_decoding_drafts_it_alone():
    """The grafted copy stops at lookup_depth (4 here); once copying, the switch proposes what suffix decoding
    alone would: the whole 8-token run that followed the text's last tokens before."""
    run = [11, 12, 13, 14, 15, 16, 17, 18]
    text = [1, 2, 3, *run, 5, 1, 2, 3]
    drafter = CombinedDrafter(RandomDrafter(50, tree=Tree.chain(2)), SuffixDrafter(), lookup_depth=4, switch=True,
                              copy_after=2)
    drafter.reset()
    drafter.observe(torch.zeros(1, len(text), 0), torch.tensor([text]))
    grafted = drafter.propose(Tree.chain(2))
    assert max(len(path) for path in drafter.last_paths) == 4
    drafter.observe(torch.zeros(1, 3, 0), torch.tensor([run[:3]]))     # three copied tokens committed
    alone = drafter.propose(Tree.chain(2))
    suffix_alone = drafter.lookup.propose(drafter.lookup.default_tree)   # reads the text, changes nothing
    assert alone.tree.paths == suffix_alone.tree.paths and torch.equal(alone.tokens, suffix_alone.tokens)
    assert alone.tokens[0].tolist()[:6] == run[2:] and grafted.tree.num_nodes > 1 + 2
