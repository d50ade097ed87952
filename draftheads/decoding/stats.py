"""Per-step statistics of a generation, mergeable over prompts.

A "step" is one verification forward of the target (with drafter=None: one plain decoding
forward). Depth index d = 0 is the first draft level (the node right below the root).
Times are wall-clock seconds (CUDA synchronised before each reading).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def shared_prefix_length(a: list, b: list) -> int:
    """How many leading tokens two sequences share: the index where they part, or the shorter one's length."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _add(a: list, b: list) -> list:
    """Element-wise sum of two ragged lists of numbers or of lists of numbers (missing entries count as 0)."""
    out = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if isinstance(x, list) or isinstance(y, list):
            out.append(_add(x or [], y or []))
        else:
            out.append((x or 0) + (y or 0))
    return out


CONTEXT_EDGES = (0, 256, 512, 1024, 2048)   # ranges of context length the report breaks tau down by


@dataclass
class GenerationStats:
    """Counters and timings of one or more `speculative_generate` calls (see `merge`)."""

    prompts: int = 0                 # generations merged into this record
    prompt_tokens: int = 0           # prompt positions prefilled
    new_tokens: int = 0              # tokens generated (prompt excluded), EOS included
    prefill_s: float = 0.0           # target prefill forward + sampling the first token
    draft_prefill_s: float = 0.0     # drafter.reset + drafter.observe of the prompt
    total_s: float = 0.0             # wall time of the whole call, everything included
    step_emitted: list[int] = field(default_factory=list)     # per step: tokens emitted (accepted drafts + 1, after
                                                              # EOS / max_new_tokens truncation)
    step_accepted: list[int] = field(default_factory=list)    # per step: drafts accepted (before truncation)
    step_nodes: list[int] = field(default_factory=list)       # per step: tree nodes verified, root included
    step_draft_s: list[float] = field(default_factory=list)   # per step: drafter.propose + drafter.observe
    step_verify_s: list[float] = field(default_factory=list)  # per step: target forward + acceptance + cache compaction
    step_context: list[int] = field(default_factory=list)     # per step: tokens committed before it (prompt +
                                                              # generated)
    drafted: list[int] = field(default_factory=list)          # per depth d: draft nodes verified at depth d+1
    reached: list[int] = field(default_factory=list)          # per depth d: steps whose accepted path reached depth d
                                                              # at a node with children
    accepted: list[int] = field(default_factory=list)         # per depth d: steps that accepted a node at depth d+1
    accepted_rank: list[list[int]] = field(default_factory=list)  # [d][r]: accepted depth-(d+1) node had sibling rank r

    # ---- recording -------------------------------------------------------------------------
    def record_step(self, tree, path: list[int], emitted: int, draft_s: float, verify_s: float,
                    context: int = 0) -> None:
        """path: accepted node indices of `tree`, root first (untruncated); context: tokens committed before the
        step."""
        self.step_context.append(context)
        self.step_emitted.append(emitted)
        self.step_accepted.append(len(path) - 1)
        self.step_nodes.append(tree.num_nodes)
        self.step_draft_s.append(draft_s)
        self.step_verify_s.append(verify_s)
        depth = tree.depth
        per_depth, reached, accepted = [0] * depth, [0] * depth, [0] * depth
        ranks = [[0] * (1 + max(tree.ranks[n] for n in range(tree.num_nodes) if tree.depths[n] == d + 1))
                 for d in range(depth)]
        for node in range(1, tree.num_nodes):
            per_depth[tree.depths[node] - 1] += 1
        for d, node in enumerate(path[:depth]):
            reached[d] = int(bool(tree.children[node]))
        for d, node in enumerate(path[1:]):
            accepted[d] = 1
            ranks[d][tree.ranks[node]] = 1
        self.drafted = _add(self.drafted, per_depth)
        self.reached = _add(self.reached, reached)
        self.accepted = _add(self.accepted, accepted)
        self.accepted_rank = _add(self.accepted_rank, ranks)

    def merge(self, other: "GenerationStats") -> "GenerationStats":
        """A new record holding both (prompts, tokens, timings and per-step lists combined)."""
        out = {}
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name.startswith("step_"):
                out[f.name] = list(a) + list(b)
            elif isinstance(a, list):
                out[f.name] = _add(a, b)
            else:
                out[f.name] = a + b
        return GenerationStats(**out)

    @classmethod
    def merged(cls, records) -> "GenerationStats":
        out = cls()
        for r in records:
            out = out.merge(r)
        return out

    # ---- derived numbers ---------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Verification forwards (the prefill forward not included)."""
        return len(self.step_emitted)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verification forward, bonus token included (1.0 for plain decoding)."""
        return sum(self.step_emitted) / max(1, self.steps)

    def tau_by_context(self, edges=CONTEXT_EDGES) -> list[dict]:
        """tau of the steps taken at each range of context length (committed tokens before the step): where acceptance
        falls off on long prompts. One entry per range that has steps."""
        out = []
        for low, high in zip(edges, [*edges[1:], None]):
            steps = [e for e, c in zip(self.step_emitted, self.step_context) if c >= low and (high is None or c < high)]
            if steps:
                out.append({"context": f"{low}-{high}" if high else f"{low}+", "steps": len(steps),
                            "tau": sum(steps) / len(steps)})
        return out

    @property
    def mean_accepted(self) -> float:
        """Mean drafts accepted per step (before truncation)."""
        return sum(self.step_accepted) / max(1, self.steps)

    @property
    def acceptance_rates(self) -> list[float]:
        """alpha_d: P(a depth-(d+1) node is accepted | the path reached depth d at a node with children)."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)]

    @property
    def rank_accuracy(self) -> list[list[float]]:
        """[d][r]: P(the rank-r child is the one accepted at depth d+1 | depth d reached with children).

        Measured with a wide tree under greedy acceptance this is the per-depth, per-rank top-k accuracy
        table `auto_tree.auto_tree` takes.
        """
        return [[c / r if r else 0.0 for c in row] for row, r in zip(self.accepted_rank, self.reached)]

    @property
    def draft_s(self) -> float:
        return sum(self.step_draft_s)

    @property
    def verify_s(self) -> float:
        return sum(self.step_verify_s)

    @property
    def decode_s(self) -> float:
        """Time after the prefills: drafting plus verification."""
        return self.draft_s + self.verify_s

    @property
    def mean_draft_s(self) -> float:
        return self.draft_s / max(1, self.steps)

    @property
    def mean_verify_s(self) -> float:
        return self.verify_s / max(1, self.steps)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of total wall time (prefills included)."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def summary(self) -> dict:
        """The headline numbers, JSON-ready."""
        return {
            "prompts": self.prompts, "new_tokens": self.new_tokens, "steps": self.steps, "tau": self.tau,
            "acceptance_rates": self.acceptance_rates, "mean_draft_s": self.mean_draft_s,
            "mean_verify_s": self.mean_verify_s, "prefill_s": self.prefill_s, "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
        }
