"""Prompt-lookup drafting: most recent, longest n-gram first; trees from distinct continuations."""

from __future__ import annotations

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.lookup import PromptLookupDrafter
from tests.decoding.test_greedy import plain, prompt_ids, target
from tests.margins import at_least


def drafter_after(history: list[int], **kw) -> PromptLookupDrafter:
    drafter = PromptLookupDrafter(**kw)
    drafter.reset()
    drafter.observe(torch.empty(1, len(history), 0), torch.tensor([history]))
    return drafter


def test_chain_follows_the_most_recent_earlier_occurrence():
    drafter = drafter_after([1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 1, 2, 3])
    proposal = drafter.propose(Tree.chain(3))
    assert proposal.tokens.tolist() == [[3, 7, 6, 1]] and proposal.q is None


def test_chain_inside_a_loop_is_carried_on_by_older_matches():
    # the most recent "7 7 7" is followed by one token only; older ones carry the chain to its full length
    drafter = drafter_after([5] + [7] * 8)
    assert drafter.chain(drafter.history[0], 6) == [7] * 6
    assert drafter.chain([1, 2, 3], 6) == []


def test_longer_ngrams_win_over_more_recent_shorter_ones():
    # the 2-gram (4, 5) occurred long ago followed by 6; the 1-gram (5) occurred recently followed by 0
    drafter = drafter_after([4, 5, 6, 7, 5, 0, 4, 5], max_ngram=2)
    assert drafter.propose(Tree.chain(1)).tokens.tolist() == [[5, 6]]


def test_tree_branches_hold_distinct_continuations_and_unfilled_nodes_are_dropped():
    drafter = drafter_after([1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 1, 2, 3])
    wanted = Tree.from_paths([(0,), (1,), (2,), (0, 0), (1, 0)] + [(0,) * k for k in range(3, 7)])
    proposal = drafter.propose(wanted)
    tokens = dict(zip(proposal.tree.paths, proposal.tokens[0, 1:].tolist()))
    # two distinct continuations: [7, 6, 1, 2, 3] (most recent) and [9, 8, 1, 2, 3]; nothing for (2,), and the
    # most recent one ends with the text after 5 tokens
    assert tokens == {(0,): 7, (1,): 9, (0, 0): 6, (1, 0): 8, (0, 0, 0): 1, (0, 0, 0, 0): 2, (0, 0, 0, 0, 0): 3}


def test_no_match_gives_the_root_alone_and_dynamic_trees_are_refused():
    drafter = drafter_after([1, 2, 3, 4])
    proposal = drafter.propose(Tree.chain(4))
    assert proposal.tree.num_nodes == 1 and proposal.tokens.tolist() == [[4]]
    with pytest.raises(DraftheadsError, match="static"):
        drafter.propose(DynamicTreeSpec(2, 3, 8))
    with pytest.raises(DraftheadsError):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


@pytest.mark.trains
def test_lookup_speeds_up_a_repetitive_generation():
    """The tiny llama's greedy text repeats itself: lookup drafts are accepted, output is unchanged."""
    out = speculative_generate(target("llama"), PromptLookupDrafter(), prompt_ids(), 40, eos_token_id=[])
    assert out.tokens.tolist() == plain("llama", "sdpa", 40).tokens.tolist()
    at_least(out.stats.tau, 1.5, "tau")   # 2.44 under every kernel setting tried
