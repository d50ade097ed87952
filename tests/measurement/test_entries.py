"""What a drafter folder is called in a report: by its run, and which of the run's drafters it is."""

from __future__ import annotations

from draftheads.measurement.entries import drafter_name


def test_a_run_s_drafters_are_named_by_the_run(tmp_path):
    run = tmp_path / "runs" / "eagle3-smollm2"
    assert drafter_name(run / "final" / "drafter") == "eagle3-smollm2"
    assert drafter_name(run / "best" / "drafter") == "eagle3-smollm2@best"
    assert drafter_name(run / "step_000400" / "drafter") == "eagle3-smollm2@step_000400"
    assert drafter_name(tmp_path / "exported" / "drafter") == "drafter"      # not a run's: the folder's own name
    assert drafter_name(tmp_path / "heads") == "heads"
