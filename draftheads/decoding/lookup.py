"""Prompt-lookup drafting (Saxena 2023, "prompt lookup decoding"): no model, just n-gram matching.

The last n tokens of the text so far (pending token included) are looked up in the earlier text;
what followed their most recent earlier occurrences is proposed. Longer n-grams first (max_ngram
down to min_ngram), most recent occurrence first. Distinct continuations fill a trie whose rank-r
child at a node is the r-th distinct next token found, cut to the requested tree; nodes nothing
was found for are dropped, so the proposal's tree is a sub-tree of the requested one (the root
alone when nothing matches: a plain decoding step). Deterministic: Proposal.q is None.
"""

from __future__ import annotations

import torch

from draftheads.core.drafter import Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree


class PromptLookupDrafter:
    """An n-gram drafter over the prompt and the generated text (no features, no parameters)."""

    feature_layers: tuple[int, ...] = ()

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, tree: Tree | None = None, max_matches: int = 16):
        if not 1 <= min_ngram <= max_ngram:
            raise DraftheadsError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches
        self.default_tree = tree or Tree.chain(6)
        self.history: list[list[int]] = []

    def reset(self) -> None:
        self.history = []

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Only the tokens matter: next_tokens [b, n] extend each row's text (the first prompt token is never
        observed, which only loses matches that start at it)."""
        rows = next_tokens.tolist()
        if not self.history:
            self.history = [[] for _ in rows]
        for history, new in zip(self.history, rows):
            history.extend(new)
        self.device = next_tokens.device

    def propose(self, tree: Tree | DynamicTreeSpec, *, temperature=0.0, top_k=0, top_p=1.0, generator=None) -> Proposal:
        if isinstance(tree, DynamicTreeSpec):
            raise DraftheadsError("prompt lookup drafts static trees; give chain:K or index paths, not dynamic:...")
        tries = [self._trie(history, tree) for history in self.history]
        kept = Tree.from_paths(set().union(*tries))
        tokens = torch.tensor([[history[-1]] * kept.num_nodes for history in self.history], dtype=torch.long)
        for row, trie in enumerate(tries):
            for node, path in enumerate(kept.paths, start=1):
                if path in trie:
                    tokens[row, node] = trie[path]
        return Proposal(kept, tokens.to(self.device))

    @property
    def pending(self) -> int:
        """The last token of the text (the pending token), for a drafter of one row."""
        return self.history[0][-1]

    def copy_paths(self, depth: int) -> list[list[int]]:
        """The chain below the root, as the one path a combination grafts onto a learned tree ([] when nothing
        matches); one row only."""
        if len(self.history) != 1:
            raise DraftheadsError("a combination with prompt lookup drafts one sequence at a time; the generation "
                                  "loop gives each row a copy")
        chain = self.chain(self.history[0], depth)
        return [chain] if chain else []

    def copy_budget(self, depth: int) -> int:
        """The most nodes copy_paths(depth) adds to a tree."""
        return depth

    def continuations(self, history: list[int], length: int) -> list[list[int]]:
        """What followed earlier occurrences of the text's last n tokens: longest n first, most recent first."""
        text = torch.tensor(history, dtype=torch.long)
        found = []
        for n in range(min(self.max_ngram, len(history) - 1), self.min_ngram - 1, -1):
            windows = text.unfold(0, n, 1)[:-1]                       # every earlier n-gram start
            starts = (windows == text[-n:]).all(-1).nonzero()[:, 0].flip(0)
            for start in starts[: self.max_matches].tolist():
                follow = history[start + n : start + n + length]
                if follow:
                    found.append(follow)
        return found

    def chain(self, history: list[int], length: int) -> list[int]:
        """The chain of at most `length` tokens this drafter proposes with Tree.chain(length): the most recent
        match's continuation, carried on by older matches that agree with it (inside a loop the most recent
        match is followed by only a token or two)."""
        trie = self._trie(history, Tree.chain(length))
        return [trie[(0,) * depth] for depth in range(1, len(trie) + 1)]

    def _trie(self, history: list[int], tree: Tree) -> dict[tuple[int, ...], int]:
        """path -> token for the requested tree's paths that some continuation fills."""
        wanted = set(tree.paths)
        trie: dict[tuple[int, ...], int] = {}
        kids: dict[tuple[int, ...], dict[int, int]] = {}   # path -> {token: rank}
        for follow in self.continuations(history, tree.depth):
            path: tuple[int, ...] = ()
            for token in follow:
                ranks = kids.setdefault(path, {})
                if token not in ranks:
                    if path + (len(ranks),) not in wanted:
                        break
                    ranks[token] = len(ranks)
                    trie[path + (ranks[token],)] = token
                path = path + (ranks[token],)
        return trie
