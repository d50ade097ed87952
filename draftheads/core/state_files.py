"""Reading back the JSON and YAML files draftheads wrote itself: data-folder metadata, markers, export records,
reports, drafter configs, checkpoint and cache records. The one reader every such read goes through.

    meta = read_json(folder / "draftheads_data.json", "data folder metadata",
                     "regenerate it: `draftheads data RECIPE --overwrite`", required=("complete",))

A file cut short by a full disk or a killed copy, or changed by hand, is a `DraftheadsError` of one line that
names the file, says how it is damaged and what to do, instead of a JSONDecodeError traceback (sometimes after
minutes of loading a target). Callers read their state files before loading targets where they can, and never
write over a file this reader refused without saying so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import yaml

from draftheads.core.errors import DraftheadsError


class DamagedFile(DraftheadsError):
    """A state file that cannot be used as written: `problem` says how (cut short, not a mapping, lacks a key)."""

    def __init__(self, path: Path, what: str, problem: str, fix: str):
        super().__init__(f"{what} {path} is damaged ({problem}); {fix}")
        self.path, self.problem = path, problem


def read_json(path, what: str, fix: str, required: tuple[str, ...] = ()) -> dict:
    """The JSON object in `path`; `what` names the file for a reader ("the update marker"), `fix` says what to do
    when it is damaged ("delete the folder and rerun"); `required`: keys it must hold."""
    return _read(Path(path), what, fix, required, _parse_json)


def read_yaml(path, what: str, fix: str, required: tuple[str, ...] = ()) -> dict:
    """The YAML mapping in `path` (a recipe copy), checked like read_json's."""
    return _read(Path(path), what, fix, required, _parse_yaml)


def read_json_lines(path, what: str, fix: str) -> list[dict]:
    """The JSON objects of a .jsonl file we wrote whole (atomically), one a line; any bad line is damage."""
    path = Path(path)
    problem, text = _problem(path, str)
    records = []
    for number, line in enumerate([] if problem else text.splitlines(), start=1):
        try:
            records += [_line_record(line)] if line.strip() else []
        except ValueError as e:
            problem = f"line {number}: {e}".replace(": line 1 column", ": column")   # the file's line, not the line's
            break
    if problem:
        raise DamagedFile(path, what, problem, fix)
    return records


def _line_record(line: str) -> dict:
    record = _parse_json(line)
    if not isinstance(record, dict):
        raise ValueError(f"holds a {type(record).__name__}, not a mapping")
    return record


def _read(path: Path, what: str, fix: str, required: tuple[str, ...], parse: Callable[[str], object]) -> dict:
    problem, data = _problem(path, parse)
    if problem is None and not isinstance(data, dict):
        problem = f"holds a {type(data).__name__}, not a mapping"
    if problem is None:
        missing = [key for key in required if key not in data]
        problem = f"lacks {', '.join(repr(k) for k in missing)}" if missing else None
    if problem:
        raise DamagedFile(path, what, problem, fix)
    return data


def _problem(path: Path, parse: Callable[[str], object]) -> tuple[str | None, object]:
    """(what is wrong with the file, None if nothing; what it parsed to)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return "missing", None
    except UnicodeDecodeError as e:
        return f"not UTF-8 text: byte {e.start}", None
    except OSError as e:
        return f"unreadable: {e.strerror or type(e).__name__}", None
    if not text.strip():
        return "empty", None
    try:
        return None, parse(text)
    except ValueError as e:   # json.JSONDecodeError and _parse_yaml's errors
        return str(e), None


def _parse_json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        # a file cut short fails in its last token (a string still open, a number or literal begun) or at its end;
        # bytes changed inside it fail earlier
        cut = e.msg.startswith("Unterminated string") or re.fullmatch(r"[-+.\w]*", text[e.pos:].rstrip())
        raise ValueError(f"{'cut short' if cut else 'not valid JSON'} ({e.msg}: line {e.lineno} column "
                         f"{e.colno})") from None


def _parse_yaml(text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ValueError(f"not valid YAML: {getattr(e, 'problem', None) or type(e).__name__}{where}") from None
