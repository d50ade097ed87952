"""The one reader of draftheads' own JSON/YAML files: every kind of damage is one line naming the file and the fix."""

import json

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.core.state_files import DamagedFile, read_json, read_json_lines, read_yaml

GOOD = {"settings": {"lr": 0.001}, "results": [1, 2]}


def written(tmp_path, data: bytes):
    path = tmp_path / "state.json"
    path.write_bytes(data)
    return path


def test_an_intact_file_reads_back_as_written(tmp_path):
    path = written(tmp_path, json.dumps(GOOD, indent=2).encode() + b"\n")
    assert read_json(path, "record", "rerun", required=("settings",)) == GOOD
    yml = tmp_path / "recipe.yaml"
    yml.write_text("# a header comment\nhead:\n  type: medusa\n")
    assert read_yaml(yml, "recipe copy", "train again") == {"head": {"type": "medusa"}}


@pytest.mark.parametrize("data, problem", [
    (b"", "empty"),
    (b"  \n", "empty"),
    (json.dumps(GOOD).encode()[:20], "cut short"),
    (b'{"settings": }', "not valid JSON"),
    (b'{"settings": "\xff"}', "not UTF-8 text: byte 14"),
    (b"[1, 2]", "holds a list, not a mapping"),
    (b'{"settings": {}}', "lacks 'results'"),
])
def test_damage_is_one_line_with_the_file_the_problem_and_the_fix(tmp_path, data, problem):
    path = written(tmp_path, data)
    with pytest.raises(DamagedFile) as caught:
        read_json(path, "the update marker", "delete the folder and rerun", required=("settings", "results"))
    message = str(caught.value)
    assert isinstance(caught.value, DraftheadsError) and "\n" not in message
    assert message.startswith(f"the update marker {path} is damaged (") and problem in message
    assert message.endswith("; delete the folder and rerun") and caught.value.problem in message


def test_missing_and_unreadable_files_are_damage_too(tmp_path):
    with pytest.raises(DamagedFile, match="is damaged \\(missing\\)"):
        read_json(tmp_path / "nope.json", "record", "rerun")
    (tmp_path / "a-folder.json").mkdir()
    with pytest.raises(DamagedFile, match="is damaged \\(unreadable: Is a directory\\)"):
        read_json(tmp_path / "a-folder.json", "record", "rerun")


def test_yaml_damage_names_its_line(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("head:\n  type: medusa\n\tnum_heads: 3\n")
    with pytest.raises(DamagedFile, match="not valid YAML: .* at line 3"):
        read_yaml(path, "recipe copy", "train again")


def test_json_lines_name_the_bad_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert read_json_lines(path, "prompt list", "regenerate") == [{"prompt": "a"}, {"prompt": "b"}]
    path.write_text('{"prompt": "a"}\n{"prompt": "b\n')
    with pytest.raises(DamagedFile, match="line 2: cut short"):
        read_json_lines(path, "prompt list", "regenerate")
    path.write_text('{"prompt": "a"}\n[3]\n')
    with pytest.raises(DamagedFile, match="line 2: holds a list"):
        read_json_lines(path, "prompt list", "regenerate")


@pytest.mark.parametrize("text, how", [
    ('{"a": 1, "b": tru', "cut short"), ('{"a": 1, "b": -', "cut short"), ('{"a": 1, "b": 2', "cut short"),
    ('{"a": 1, "b": "tw', "cut short"), ('{"a": 1, "b": ', "cut short"),
    ('{"a": 1, "b": 2~', "not valid JSON"), ('{"a"~ 1, "b": 2}', "not valid JSON"),
    ('{"a": 1,, "b": 2}', "not valid JSON"),
])
def test_a_file_cut_short_is_told_from_one_changed_inside(tmp_path, text, how):
    with pytest.raises(DamagedFile, match=f"is damaged \\({how} \\("):
        read_json(written(tmp_path, text.encode()), "record", "rerun")
