"""Earlier reports and cached profiles that are damaged: one line naming the file, or a profile measured again with a
note; never a traceback, never silently."""

import json

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.costmodel import profile
from draftheads.costmodel.earlier_report import read_earlier

ROW = {"drafter": "eagle", "rule": "greedy", "temperature": 0.0, "tree": "chain:3", "tau": 2.0, "mean_nodes": 4.0}


def report(tmp_path, text: str):
    (tmp_path / "report.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize("text, problem", [
    (json.dumps({"settings": {}, "results": [ROW]})[:30], "is damaged \\(cut short"),
    (json.dumps({"settings": {}}), "is damaged \\(lacks 'results'\\)"),
    (json.dumps({"settings": {}, "results": ["eagle"]}), "is not a draftheads eval report \\(AttributeError"),
    (json.dumps({"settings": [], "results": [ROW]}), "is not a draftheads eval report \\(AttributeError"),
])
def test_a_damaged_tau_from_report_is_one_line(tmp_path, text, problem):
    folder = report(tmp_path, text)
    with pytest.raises(DraftheadsError, match=f"{folder / 'report.json'} {problem}"):
        read_earlier(str(folder))


def test_an_intact_tau_from_report_reads_back(tmp_path):
    earlier = read_earlier(str(report(tmp_path, json.dumps({"settings": {"prompts": "humaneval"}, "results": [ROW]}))))
    assert earlier.shape("eagle", "greedy", 0.0, "chain:3", 3).tau == 2.0 and earlier.prompts == "humaneval"


def test_a_damaged_cached_profile_is_said_and_measured_again(tmp_path, capsys):
    path = tmp_path / "target-abc.json"
    path.write_text('{"key": {"model": "x"}, "forward_s": [[0.1, 0.')
    assert profile.load(path) is None and path.exists()
    assert f"cached cost profile {path} is damaged (cut short" in capsys.readouterr().err
    assert profile.load(tmp_path / "absent.json") is None and not capsys.readouterr().err
