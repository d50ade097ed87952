"""Prompt sources: formats, local files, HumanEval, mixing by weight, and the target's own (self) prompts."""

import collections
import json

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.data.datagen import DataConfig
from draftheads.data.prompt_source import Prompt, PromptSource
from draftheads.data.prompt_tables import detect_format, row_to_prompt
from draftheads.data.prompts import collect_prompts, load_source, read_prompts, save_prompts
from draftheads.data.self_prompts import (
    check_self_prompt,
    fill_quotas,
    is_degenerate,
    quotas,
    self_prompts,
    trim_unfinished,
)

ROWS = {
    "sharegpt": {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
                                   {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Add 2 and 2."}]},
    "messages": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                              {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Add 2 and 2."}]},
    "turns": {"question_id": 81, "category": "writing", "turns": ["Hi", "Add 2 and 2."]},
    "alpaca": {"instruction": "Hi", "input": "Add 2 and 2.", "output": "4"},
    "prompt": {"prompt": "Hi"},
    "text": {"text": "Hi"},
}
EXPECTED = {
    "sharegpt": (["Hi", "Add 2 and 2."], "Be brief."),
    "messages": (["Hi", "Add 2 and 2."], None),
    "turns": (["Hi", "Add 2 and 2."], None),
    "alpaca": (["Hi\n\nAdd 2 and 2."], None),
    "prompt": (["Hi"], None),
    "text": (["Hi"], None),
}


@pytest.mark.parametrize("kind", list(ROWS))
def test_formats_are_detected_and_keep_only_user_turns(kind):
    row = ROWS[kind]
    fmt = detect_format(list(row))
    assert fmt == ("prompt" if kind == "text" else kind)
    prompt = row_to_prompt(row, fmt)
    assert (prompt.turns, prompt.system) == EXPECTED[kind]


def test_a_rows_task_kind_is_kept():
    """A local prompt file may say each row's kind (as the bundled 'tasks' set does): eval breaks its report down by
    it."""
    assert row_to_prompt({"kind": "translation", "turns": ["Translate into French: hello"]},
                         "turns").kind == "translation"
    assert row_to_prompt({"prompt": "Hi", "kind": 3}, "prompt").kind == ""


def test_unknown_format_lists_the_columns():
    with pytest.raises(DraftheadsError, match=r"\['answer', 'question'\]"):
        detect_format(["question", "answer"])


@pytest.mark.parametrize("row,fmt", [
    ({"conversations": [{"from": "gpt", "value": "I speak first"}]}, "sharegpt"),
    ({"messages": [{"role": "user", "content": "   "}]}, "messages"),
    ({"turns": []}, "turns"),
    ({"instruction": "", "input": "x"}, "alpaca"),
    ({"prompt": None}, "prompt"),
])
def test_rows_without_user_turn_give_none(row, fmt):
    assert row_to_prompt(row, fmt) is None


def write_rows(path, rows):
    """Write rows as .jsonl, .json, .csv or .parquet by suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import datasets

        table = datasets.Dataset.from_list(rows)
        table.to_csv(str(path), index=False) if path.suffix == ".csv" else table.to_parquet(str(path))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_local_files_are_auto_detected(tmp_path, suffix):
    rows = ([{"instruction": f"Task {i}", "input": "", "output": "x"} for i in range(5)]
            + [{"instruction": "", "input": "", "output": "y"}])
    path = write_rows(tmp_path / f"data{suffix}", rows)
    skipped = collections.Counter()
    prompts = load_source(PromptSource(source=str(path)), skipped)
    assert [p.turns for p in prompts] == [[f"Task {i}"] for i in range(5)]
    assert [p.row for p in prompts] == list(range(5)) and prompts[0].source == str(path)
    assert skipped == {f"{path}: row with no user turn": 1}


def test_multi_turn_jsonl_and_column_mapping(tmp_path):
    rows = [{"dialog": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "user", "content": "c"}]}]
    path = write_rows(tmp_path / "chats.jsonl", rows)
    prompts = load_source(PromptSource(source=str(path), columns={"messages": "dialog"}))
    assert prompts[0].turns == ["a", "c"]
    with pytest.raises(DraftheadsError, match="column 'talk' not found"):
        load_source(PromptSource(source=str(path), columns={"messages": "talk"}))


def test_explicit_format_and_limit(tmp_path):
    path = write_rows(tmp_path / "t.jsonl", [{"turns": [f"q{i}"], "prompt": "ignored"} for i in range(10)])
    prompts = load_source(PromptSource(source=str(path), format="turns", limit=3))
    assert [p.turns for p in prompts] == [["q0"], ["q1"], ["q2"]]


def test_saved_dataset_folder_loads(tmp_path):
    import datasets

    datasets.Dataset.from_list([{"prompt": "one two three"}]).save_to_disk(str(tmp_path / "ds"))
    assert load_source(PromptSource(source=str(tmp_path / "ds")))[0].turns == ["one two three"]


@pytest.mark.parametrize("content,match", [
    ("", "empty"),
    ('{"question": "x", "answer": "y"}\n', "cannot tell the chat format"),
    ('{"prompt": ""}\n{"prompt": "  "}\n', "no row with a user turn"),
])
def test_bad_sources_give_one_line_errors(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DraftheadsError, match=match) as err:
        load_source(PromptSource(source=str(path)))
    assert "\n" not in str(err.value)


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(DraftheadsError, match="does not exist"):
        load_source(PromptSource(source=str(tmp_path / "nope.jsonl")))
    (tmp_path / "p.txt").write_text("hello")
    with pytest.raises(DraftheadsError, match="not .json, .jsonl, .parquet or .csv"):
        load_source(PromptSource(source=str(tmp_path / "p.txt")))


def test_humaneval_has_164_prompts():
    prompts = load_source(PromptSource(source="humaneval"))
    assert len(prompts) == 164
    assert "def has_close_elements(" in prompts[0].turns[0] and prompts[0].source == "humaneval"
    assert len(load_source(PromptSource(source="humaneval", limit=5))) == 5


def test_tasks_set_cycles_through_eight_kinds_and_is_never_trained_on():
    prompts = load_source(PromptSource(source="tasks"))
    kinds = collections.Counter(p.kind for p in prompts)
    assert len(kinds) == 8 and set(kinds.values()) == {10}
    assert len({p.kind for p in load_source(PromptSource(source="tasks", limit=16))}) == 8   # 2 of each kind
    assert all(len(p.turns) == 2 for p in prompts if p.kind == "multi-turn")
    assert min(len(p.turns[0]) for p in prompts if p.kind == "summarization") > 1000     # long passages
    assert min(len(p.turns[0]) for p in prompts if p.kind == "retrieval") > 500         # three documents each
    assert len({tuple(p.turns) for p in prompts}) == 80
    with pytest.raises(DraftheadsError, match="is an evaluation set and is never trained on"):
        collect_prompts(DataConfig(prompts=[PromptSource(source="tasks")], num_prompts=4))


def test_long_set_cycles_through_the_passage_kinds_at_long_context_lengths_and_is_never_trained_on():
    prompts = load_source(PromptSource(source="long"))
    kinds = collections.Counter(p.kind for p in prompts)
    assert set(kinds) == {"summarization", "extraction", "qa", "retrieval"} and min(kinds.values()) >= 5
    assert ([p.kind for p in load_source(PromptSource(source="long", limit=4))]
            == ["summarization", "extraction", "qa", "retrieval"])
    assert min(len(p.turns[0]) for p in prompts) > 500                               # an article each
    assert min(len(p.turns[0]) for p in prompts if p.kind == "retrieval") > 5000    # four articles
    assert len({tuple(p.turns) for p in prompts}) == len(prompts)
    with pytest.raises(DraftheadsError, match="is an evaluation set and is never trained on"):
        collect_prompts(DataConfig(prompts=[PromptSource(source="long")], num_prompts=4))


def test_quotas_follow_weights_and_availability():
    assert quotas([3, 1], 40) == [30, 10]
    assert sum(quotas([1, 1, 1], 10)) == 10
    assert fill_quotas([1, 1], [3, float("inf")], 10) == [3, 7]  # the shortfall moves to the other source
    assert fill_quotas([1, 2, 1], [100, 5, 100], 20) == [8, 5, 7]
    assert fill_quotas([1], [4], 10) == [4]


def test_collect_mixes_by_weight_with_a_fixed_order(tmp_path):
    a = write_rows(tmp_path / "a.jsonl", [{"prompt": f"a{i}"} for i in range(100)])
    b = write_rows(tmp_path / "b.jsonl", [{"prompt": f"b{i}"} for i in range(100)])
    data = DataConfig(prompts=[PromptSource(source=str(a), weight=3), PromptSource(source=str(b), weight=1)],
                      num_prompts=40)
    prompts, _ = collect_prompts(data)
    counts = collections.Counter(p.turns[0][0] for p in prompts)
    assert counts == {"a": 30, "b": 10} and len({p.turns[0] for p in prompts}) == 40
    again, _ = collect_prompts(data)
    assert [p.turns for p in again] == [p.turns for p in prompts]
    data.seed = 1
    other, _ = collect_prompts(data)
    assert [p.turns for p in other] != [p.turns for p in prompts]


def test_prompts_round_trip_through_jsonl(tmp_path):
    prompts = [Prompt(["a", "b"], "sys", "x.jsonl", 3), Prompt(["c"])]
    save_prompts(tmp_path / "p.jsonl", prompts)
    assert read_prompts(tmp_path / "p.jsonl") == prompts


@pytest.mark.parametrize("text,finished,reason", [
    ("Write a Python function that reverses a string.", True, None),
    ("Write a Python function that reverses a string.", False, "unfinished (hit max_tokens)"),
    ("   ", True, "empty"),
    ("Hi there", True, "too short"),
    ("Explain this <|im_start|>assistant", True, "template markup or broken characters"),
    ("Tell me\nTell me\nTell me\nnow please", True, "degenerate or repetitive"),
    ("the the the the the the the the the the", True, "degenerate or repetitive"),
    ("What is this?????????????????? I wonder", True, "degenerate or repetitive"),
])
def test_self_prompt_filter(text, finished, reason):
    assert check_self_prompt(text, finished) == reason


@pytest.mark.parametrize("text,kept", [
    ("Write a Python function that sums a list. For example, given", "Write a Python function that sums a list."),
    ("Is it prime? Write a test.\n\nThen use", "Is it prime? Write a test."),
    ("Fix this code. Example:\n```python\nx = 1. y = 2", "Fix this code."),  # never cut inside a code fence
    ("Write a Python function that takes a list of", None),
])
def test_unfinished_prompts_are_cut_back_to_their_last_sentence(text, kept):
    assert trim_unfinished(text) == kept


def test_self_prompts_keep_the_full_sentences_of_unfinished_prompts():
    write = lambda n, *_: [(f"Write a function number {i} that sums a list. For example, given", False)
                           for i in range(n)]
    prompts = self_prompts(write, 2, PromptSource(source="self"), 0, collections.Counter())
    assert [p.turns[0] for p in prompts] == ["Write a function number 0 that sums a list.",
                                             "Write a function number 1 that sums a list."]


def test_is_degenerate_leaves_normal_text_alone():
    assert not is_degenerate("Write a function that returns the sum of a list of numbers.\nUse a for loop.")
    assert is_degenerate("a b c a b c a b c a b c a b c")


def test_self_prompts_dedupe_filter_and_count():
    canned = [("How do I sort a list in Python?", True), ("how do I  sort a list in python?", True),
              ("", True), ("Write a haiku about the sea and", False), ("Explain recursion with an example.", True)]
    calls = []

    def write(count, max_tokens, temperature, seed, lead):
        calls.append((count, max_tokens, temperature, seed))
        return canned if len(calls) == 1 else [("What is a closure in JavaScript?", True)] * count

    skipped = collections.Counter()
    src = PromptSource(source="self", max_tokens=64, temperature=0.9)
    prompts = self_prompts(write, 3, src, seed=5, skipped=skipped)
    assert [p.turns[0] for p in prompts] == ["How do I sort a list in Python?", "Explain recursion with an example.",
                                             "What is a closure in JavaScript?"]
    assert (skipped["self: duplicate"] >= 2 and skipped["self: empty"] == 1
            and skipped["self: unfinished (hit max_tokens)"] == 1)
    assert calls[0][1:3] == (64, 0.9) and calls[0][3] != calls[1][3]  # a fresh seed each round


def test_self_prompts_that_all_fail_give_an_error():
    with pytest.raises(DraftheadsError, match="no usable prompt"):
        self_prompts(lambda n, *_: [("", True)] * n, 4, PromptSource(source="self"), 0, collections.Counter())


def test_self_source_needs_a_writer():
    with pytest.raises(DraftheadsError, match="need the target"):
        collect_prompts(DataConfig(num_prompts=3))


def test_self_prompts_from_a_tiny_target(llama_target, tokenizer):
    """The target's own generation writes the prompts; every one passes the filter and they are distinct."""
    from draftheads.data.batch_generate import LocalBackend

    data = DataConfig(num_prompts=6, batch_size=4)
    backend = LocalBackend(llama_target, tokenizer, data)
    texts = backend.write(5, max_tokens=8, temperature=1.0, seed=0)
    assert len(texts) == 5 and all(isinstance(t, str) for t, _ in texts)
    assert texts == backend.write(5, max_tokens=8, temperature=1.0, seed=0)  # seeded
    led = backend.write(4, max_tokens=6, temperature=1.0, seed=0, lead="Write a Python function")
    assert all(t.startswith("Write a Python function") and len(t) > len("Write a Python function") for t, _ in led)
    good = [("Question %d: how do I reverse a string in Python?" % i, True) for i in range(10)]
    backend.write = lambda n, *a: good[:n]
    prompts, skipped = collect_prompts(data, write=backend.write)
    assert len(prompts) == 6 and len({p.turns[0] for p in prompts}) == 6 and not skipped


def test_self_prompts_pass_their_lead_to_the_writer():
    calls = []

    def write(n, max_tokens, temperature, seed, lead):
        calls.append(lead)
        return [(f"{lead} number {seed}-{i} that sorts a list", True) for i in range(n)]

    src = PromptSource(source="self", starts_with="Write a Python function")
    prompts = self_prompts(write, 3, src, 0, collections.Counter())
    assert calls == ["Write a Python function"] and all(p.turns[0].startswith("Write a Python function")
                                                        for p in prompts)


@pytest.mark.parametrize("kwargs, message", [
    ({"source": "humaneval", "starts_with": "Write"}, "only applies to source 'self'"),
    ({"source": "self", "starts_with": "Write a "}, "must not end with a space"),
])
def test_starts_with_is_checked(kwargs, message):
    with pytest.raises(DraftheadsError, match=message):
        PromptSource(**kwargs)
