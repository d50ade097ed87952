"""A suffix trie with counts over a set of token sequences, cut at a fixed depth: what suffix decoding
(Oliaro et al. 2024, "SuffixDecoding"; ArcticInference) matches the text against and grows its trees from.

Every start position of every sequence inserts the next `max_depth` tokens as a path from the root, and each
node counts the positions it was reached from: count(node) is how often its token string occurs in the
sequences (strings longer than `max_depth` are not told apart), and count(child) / count(node) how often that
string went on with the child's token. Sequences grow token by token (`extend`, O(max_depth) per token, from
the nodes of the sequence's current suffixes) and leave whole (`remove`), so a bounded cache can evict its
oldest ones.

    trie = SuffixTrie(max_depth=24)
    trie.extend("prompt", [5, 6, 7, 5, 6])
    node, length = trie.match([9, 5, 6])        # the deepest node a suffix of the text reaches that has children
    node.children[7].count / node.count          # 0.5: "5 6" occurs twice, once followed by 7
"""

from __future__ import annotations

from collections.abc import Hashable


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """Counts of every token string of length <= max_depth in the sequences it holds, keyed by sequence."""

    def __init__(self, max_depth: int):
        if max_depth < 2:
            raise ValueError(f"a suffix trie needs max_depth >= 2 (a match and a token after it), got {max_depth}")
        self.max_depth = max_depth
        self.root = Node()
        self.sequences: dict[Hashable, list[int]] = {}   # insertion order = age (dicts keep it)
        self.open: dict[Hashable, list[Node]] = {}        # per sequence: the nodes of its last max_depth - 1 suffixes
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def extend(self, key: Hashable, tokens: list[int]) -> None:
        """Append tokens to sequence `key` (a new one if unknown): each token extends the paths of the sequence's
        last max_depth - 1 suffixes and starts one of its own."""
        text = self.sequences.setdefault(key, [])
        suffixes = self.open.setdefault(key, [])
        for token in tokens:
            grown = []
            for node in suffixes + [self.root]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                child.count += 1
                grown.append(child)
            self.root.count += 1
            suffixes = grown[-(self.max_depth - 1):]   # the oldest one reached max_depth: it grows no further
            text.append(token)
        self.open[key] = suffixes
        self.tokens += len(tokens)

    def remove(self, key: Hashable) -> None:
        """Take sequence `key` out: every path it inserted loses one count, and nodes left with none go."""
        text = self.sequences.pop(key, None)
        self.open.pop(key, None)
        if text is None:
            return
        for start in range(len(text)):
            self.root.count -= 1
            node = self.root
            for token in text[start : start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]   # its whole subtree counted only this sequence
                    break
                node = child
        self.tokens -= len(text)

    def match(self, text: list[int], max_length: int | None = None) -> tuple[Node | None, int]:
        """(node, length): the longest suffix of `text` (at most max_length, below max_depth) that occurs in the
        sequences followed by something, and its node; (None, 0) when not even the last token does."""
        longest = min(len(text), self.max_depth - 1, max_length or self.max_depth)
        for length in range(longest, 0, -1):
            node = self.root
            for token in text[len(text) - length :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return None, 0
