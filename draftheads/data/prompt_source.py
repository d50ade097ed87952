"""A prompt and the recipe's description of where prompts come from (data.prompts: one `PromptSource` each).

A prompt is the list of user turns of one conversation (assistant turns in a source are dropped: the target writes
its own). Sources are read by data/prompt_tables.py (files, hub datasets, the bundled sets) or written by the target
(data/self_prompts.py); data/prompts.py mixes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.core.config import check, doc
from draftheads.data.task_kinds import resolve_kinds

FORMATS = ("sharegpt", "messages", "turns", "alpaca", "prompt")


@dataclass
class Prompt:
    """The user turns of one conversation, with where they came from."""

    turns: list[str]
    system: str | None = None
    source: str = ""
    row: int = 0
    kind: str = ""   # the task kind, for prompt sets that have them ('tasks')


@dataclass
class PromptSource:
    """One source of prompts for data generation."""

    source: str = doc("self", "'self' (the target writes prompts), 'humaneval', 'tasks' or 'long' (evaluation only), a "
                              "hub dataset, or a local json/jsonl/parquet/csv file")
    weight: float = doc(1.0, "relative share of the prompts drawn from this source")
    split: str = doc("train", "dataset split")
    subset: str | None = doc(None, "dataset configuration name")
    format: Literal["auto", "sharegpt", "messages", "turns", "alpaca", "prompt"] = doc(
        "auto", "chat format of the rows")
    columns: dict[str, str] = doc({}, "column renames, e.g. {conversations: dialog}")
    limit: int | None = doc(None, "use at most this many rows of the source")
    temperature: float = doc(1.0, "'self' only: sampling temperature of the prompts the target writes")
    max_tokens: int = doc(128, "'self' only: longest prompt the target writes, in tokens (longer ones are cut back to "
                                      "their last full sentence, or dropped if they have none)")
    starts_with: str = doc("", "'self' only: words every prompt begins with, steering the topic (e.g. 'Write a Python "
                               "function')")
    kinds: str | dict[str, float] | None = doc(None, "'self' only: task kinds of the prompts, 'general' (the "
                                                     "documented default mixture, data/task_kinds.py: GENERAL) or "
                                                     "{kind: weight}, e.g. {writing: 1, coding: 3, summarization: 1}; "
                                                     "none: open-ended messages")
    passage_tokens: int = doc(512, "'self' kinds with a passage (summarization, extraction, qa, retrieval): the "
                                   "longest article the target writes for one")

    def __post_init__(self):
        check(self.weight > 0, f"data.prompts: weight must be positive, got {self.weight}")
        check(self.limit is None or self.limit > 0, f"data.prompts: limit must be positive, got {self.limit}")
        check(self.temperature > 0, "data.prompts: temperature must be > 0 (greedy would write one prompt over and "
                                    f"over), got {self.temperature}")
        check(self.max_tokens > 0, f"data.prompts: max_tokens must be positive, got {self.max_tokens}")
        check(not self.starts_with or self.source == "self",
              f"data.prompts: starts_with only applies to source 'self', not '{self.source}'")
        check(self.starts_with == self.starts_with.rstrip(), "data.prompts: starts_with must not end with a space (the "
                                                             "target writes the next word with its own space)")
        check(self.kinds is None or self.source == "self",
              f"data.prompts: kinds only apply to source 'self', not '{self.source}'")
        check(self.kinds is None or not self.starts_with,
              "data.prompts: give kinds or starts_with, not both (each kind has its own leads)")
        check(self.passage_tokens > 0, f"data.prompts: passage_tokens must be positive, got {self.passage_tokens}")
        if self.kinds is not None:
            resolve_kinds(self.kinds)
