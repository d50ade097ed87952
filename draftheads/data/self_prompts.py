"""Prompts the target writes itself (Magpie: the chat template up to a user turn, sampled): open-ended messages, or
task kinds by their leads and passages (data/task_kinds.py); each checked, trimmed to its last full sentence and
kept once.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable

from draftheads.core.errors import DraftheadsError
from draftheads.data.prompt_source import Prompt
from draftheads.data.task_kinds import PASSAGE_KINDS, Writers, kind_prompts, resolve_kinds

# A generator of user messages: (count, max_tokens, temperature, seed, lead) -> [(text, finished)], each
# text starting with `lead` (the source's starts_with, "" for none).
Writer = Callable[[int, int, float, int, str], list[tuple[str, bool]]]
MARKUP = re.compile(r"<\|[^|>]*\|>|\[/?INST\]|<start_of_turn>|<end_of_turn>|</?s>")
SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def trim_unfinished(text: str) -> str | None:
    """A prompt that max_tokens cut off, back to its last full sentence outside code fences; None if it has none.

    Targets write long task statements (SmolLM2: "Write a Python function that ... . For example, ...");
    the first sentences already make a complete task, and trimming keeps most of them at a small max_tokens.
    """
    for end in reversed([m.end() for m in SENTENCE_END.finditer(text)]):
        if text[:end].count("```") % 2 == 0:
            return text[:end]
    return None


def check_self_prompt(text: str, finished: bool) -> str | None:
    """Why a self-written prompt is unusable, or None when it is fine."""
    if not finished:
        return "unfinished (hit max_tokens)"
    text = text.strip()
    if not text:
        return "empty"
    if len(text) < 10 or len(text.split()) < 3:
        return "too short"
    if MARKUP.search(text) or "\ufffd" in text:
        return "template markup or broken characters"
    if is_degenerate(text):
        return "degenerate or repetitive"
    return None


def is_degenerate(text: str) -> bool:
    """Repeated lines, a few words over and over, or one character run long (e.g. '!!!!!!!!!!!!')."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and collections.Counter(lines).most_common(1)[0][1] >= 3:
        return True
    words = text.lower().split()
    if len(words) >= 8 and len(set(words)) / len(words) < 0.35:
        return True
    grams = [" ".join(words[i:i + 3]) for i in range(len(words) - 2)]
    if grams and collections.Counter(grams).most_common(1)[0][1] >= 4:
        return True
    return re.search(r"(\S)\1{11,}", text) is not None


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def self_prompts(write: Writer, count: int, src, seed: int, skipped: collections.Counter, rounds: int = 8,
                 seen: set[str] = frozenset()) -> list[Prompt]:
    """`count` distinct, filtered prompts written by the target, none of them in `seen` (normalised);
    fewer (counted) if it keeps failing."""
    prompts, seen = [], set(seen)
    for attempt in range(rounds):
        if len(prompts) >= count:
            break
        need = count - len(prompts)
        # Ask for a quarter more than needed, a margin over the share of written prompts the filters drop or that
        # repeat one already taken; later rounds top up whatever is still missing.
        for text, finished in write(need + need // 4 + 4, src.max_tokens, src.temperature, seed * 1000 + attempt,
                                    src.starts_with):
            trimmed = None if finished else trim_unfinished(text)
            if trimmed is not None:
                text, finished = trimmed, True
            reason = check_self_prompt(text, finished)
            if reason is None and normalise(text) in seen:
                reason = "duplicate"
            if reason is not None:
                skipped[f"self: {reason}"] += 1
                continue
            seen.add(normalise(text))
            prompts.append(Prompt([text.strip()], source="self", row=len(prompts)))
    if not prompts:
        raise DraftheadsError("the target wrote no usable prompt (see the skip counts); raise temperature or "
                              "max_tokens of the self source, or use a dataset")
    return prompts[:count]


def kinds_prompts(writers: Writers, count: int, src, seed: int, skipped: collections.Counter,
                  seen: set[str] = frozenset()) -> list[Prompt]:
    """`count` prompts of the source's task kinds, split by their weights (data/task_kinds.py)."""
    kinds = resolve_kinds(src.kinds)
    seen = set(seen)

    def messages(n: int, source, message_seed: int, leads: tuple[str, ...]) -> list[str]:
        """n distinct user messages, the leads taking turns; each lead written with its own seed."""
        out = []
        for i, (lead, quota) in enumerate(zip(leads, quotas([1.0] * len(leads), n))):
            if quota:
                lead_src = dataclasses.replace(source, starts_with=lead, kinds=None)
                written = self_prompts(writers.write, quota, lead_src, message_seed * 7 + i, skipped, seen=seen)
                seen.update(normalise(p.turns[0]) for p in written)
                out += [p.turns[0] for p in written]
        return out

    prompts = []
    for i, (kind, quota) in enumerate(zip(kinds, quotas(list(kinds.values()), count))):
        if quota:
            for turns, _ in kind_prompts(kind, quota, writers, src, seed * 1009 + i, skipped, messages):
                if kind in PASSAGE_KINDS and normalise(turns[0]) in seen:   # message kinds' texts are distinct already
                    skipped["self: duplicate"] += 1
                    continue
                seen.add(normalise(turns[0]))
                prompts.append(Prompt(turns, source="self", row=len(prompts), kind=kind))
    if not prompts:
        raise DraftheadsError("the target wrote no usable prompt of any kind (see the skip counts); raise temperature "
                              "or max_tokens of the self source, or use a dataset")
    return prompts


# ---------------------------------------------------------------- mixing


def quotas(weights: list[float], total: int) -> list[int]:
    """Split `total` by weight with largest remainders (ties: earlier source)."""
    share = [w / sum(weights) * total for w in weights]
    out = [int(s) for s in share]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(share[i] - out[i]), i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    return out


def fill_quotas(weights: list[float], available: list[float], total: int) -> list[int]:
    """Quotas by weight, capped by what each source has; the shortfall goes to sources with rows to spare."""
    take = [0] * len(weights)
    open_ = [i for i in range(len(weights)) if available[i] > 0]
    while sum(take) < total and open_:
        # Each pass either fills every quota or caps at least one source, so it ends.
        extra = quotas([weights[i] for i in open_], total - sum(take))
        for i, q in zip(open_, extra):
            take[i] += int(min(q, available[i] - take[i]))
        open_ = [i for i in open_ if take[i] < available[i]]
    return take
