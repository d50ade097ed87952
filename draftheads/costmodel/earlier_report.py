"""The acceptance an earlier `draftheads eval` measured, as the cost model's input for a new run's prediction.

    earlier = read_earlier("runs/eval-1")              # a report folder or its report.json
    shape = earlier.shape("eagle", "greedy", 0.0, "static(8 nodes, depth 3) (auto)")   # StepShape or None

The cost model predicts a run's speedup from the machine's profile and the drafter's acceptance. By default the
acceptance comes from the calibration prompts, a handful of prompts that are not evaluated; tau varies from prompt to
prompt (prompt lookup's most of all), so a few prompts predict a different set's tau only roughly. An earlier
evaluation of the same drafter, tree and rule measured tau on more prompts; its timings are not used, only tau and the
nodes verified per step, so the prediction stays one made before the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.state_files import read_json
from draftheads.costmodel.cost_model import StepShape


@dataclass
class EarlierReport:
    path: Path
    prompts: str
    limit: int | None
    rows: dict   # (drafter, rule, temperature, tree) -> (tau, nodes per step)

    def shape(self, drafter: str, rule: str, temperature: float, tree: str, depth: int) -> StepShape | None:
        found = self.rows.get((drafter, rule, float(temperature), tree))
        return StepShape(found[0], found[1], depth) if found else None

    def describe(self) -> str:
        limit = f", first {self.limit}" if self.limit else ""
        return f"{self.path} ({self.prompts}{limit})"


def read_earlier(path: str) -> EarlierReport:
    """An earlier evaluation's batch-size-1 rows; a one-line error when `path` is not a readable report."""
    file = Path(path)
    file = file / "report.json" if file.is_dir() else file
    if not file.exists():
        raise DraftheadsError(f"--tau-from: no report at {file}; give the folder or report.json of an earlier "
                              "draftheads eval")
    report = read_json(file, "--tau-from report", "give the report of an intact earlier draftheads eval, or run "
                       "that eval again", required=("results", "settings"))
    try:
        rows = {(r["drafter"], r["rule"], float(r["temperature"]), r["tree"]): (float(r["tau"]), float(r["mean_nodes"]))
                for r in report["results"] if r.get("batch_size", 1) == 1 and r.get("steps", 1)}
        settings = report["settings"]
        return EarlierReport(file.parent, settings.get("prompts", "?"), settings.get("limit"), rows)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise DraftheadsError(f"--tau-from: {file} is not a draftheads eval report ({type(e).__name__}: {e}); "
                              "give the report.json an earlier draftheads eval wrote") from None
