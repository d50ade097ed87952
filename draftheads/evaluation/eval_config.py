"""A recipe's eval: section, the settings `draftheads eval` takes for the flags it is not given."""

from __future__ import annotations

from dataclasses import dataclass

from draftheads.core.config import check, doc
from draftheads.core.tree import parse_tree
from draftheads.decoding.accept import check_rule


@dataclass
class EvalConfig:
    """Acceptance evaluation (`draftheads eval`)."""

    prompts: str = doc("humaneval", "'humaneval', 'tasks' (the bundled set of 8 task kinds), a local file, or a hub dataset")
    limit: int | None = doc(20, "evaluate on at most this many prompts")
    accept: list[str] = doc(["greedy"], "acceptance rules: greedy, strict, typical")
    temperatures: list[float] = doc([0.0], "sampling temperatures")
    tree: str | None = doc(None, "chain:K, dynamic:TOPK,DEPTH,TOTAL, auto, or static:PATHS (default: the drafter's)")
    max_new_tokens: int = doc(128, "tokens generated per prompt")
    typical_epsilon: float = doc(0.09, "typical acceptance: hard threshold epsilon")
    typical_delta: float = doc(0.3, "typical acceptance: entropy-scaled threshold delta")
    seed: int = doc(0, "sampling seed")
    batch_sizes: list[int] = doc([1], "decode the prompts in batches of each of these sizes (more than [1]: the speedup-vs-batch curve)")
    plain_above: int | None = doc(None, "decode plainly while more than this many rows of a batch are generating")

    def __post_init__(self):
        for rule in self.accept:
            check_rule(rule, "eval.accept")
        check(all(t >= 0 for t in self.temperatures), "eval.temperatures must be >= 0")
        check(self.limit is None or self.limit > 0, "eval.limit must be positive")
        check(self.max_new_tokens > 0, "eval.max_new_tokens must be positive")
        for name in ("typical_epsilon", "typical_delta"):  # at 1 or above nothing but a certain token could be accepted
            check(0 < getattr(self, name) < 1, f"eval.{name} must be in (0, 1), got {getattr(self, name)}")
        check(bool(self.batch_sizes) and all(b >= 1 for b in self.batch_sizes), "eval.batch_sizes must be whole numbers >= 1")
        check(self.plain_above is None or self.plain_above >= 1, "eval.plain_above must be >= 1 (or null: always speculate)")
        parse_tree(self.tree, "eval.tree")  # a bad or oversized tree is refused with the recipe
