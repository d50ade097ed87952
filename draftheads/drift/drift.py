"""`draftheads drift DRAFTER --target NEW`: what an updated target does to a drafter trained for the old one.

    folder = run_drift("runs/eagle3-smollm2", "targets/full-40", EvalConfig(limit=10))

Three things, in one report folder:
1. How far the target moved (drift/target_shift.py): top-1 agreement and KL between the old and the new target
   on the drafter's own training rows (the data folder its run recipe names, or --data), before any decoding.
2. The drop predicted from that alone: a draft accepted at depth k by the old target passed k positions where the old
   target's top-1 was the draft; each of those survives on the new target with probability about `agreement`, so
   P'(accepted >= k) = P(accepted >= k) * agreement^k, with P from the old target's accepted-length histogram, and
   tau' = tau * (1 + sum_k P'(>= k)) / (1 + sum_k P(>= k)). It needs one `draftheads eval` on the old target (which
   a served drafter has already) and a forward of both targets over 64 rows: minutes, no decoding on the new one.
3. What happens: the same `draftheads eval` (same prompts, tree, rules) on the old target and on the new one, each
   in its own folder (old/, new/), the new one decoding the new target's own outputs, as serving it would; per
   rule: tau, per-depth acceptance and speedup on both, the predicted tau beside the measured one.

The old target is the one the drafter was trained for (its config.json), unless --old-target names another.
"""

from __future__ import annotations

from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import run_recipe
from draftheads.core.state_files import read_json
from draftheads.data.datastore import check_finished, load_rows
from draftheads.drift.drift_config import SHIFT_ROWS, DriftConfig
from draftheads.drift.target_shift import target_shift
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.plots import plot_drift
from draftheads.evaluation.report import now, write_report
from draftheads.evaluation.report_folder import check_report_folder, report_folder
from draftheads.evaluation.saved_runs import load_eval_target, saved_target_name
from draftheads.interop.native import resolve_drafter_folder
from draftheads.measurement.drafter_specs import learned_paths, model_free


def run_drift(drafter: str, target: str, config: EvalConfig | None = None, *, old_target: str | None = None,
              data: str | None = None, rows: int = SHIFT_ROWS, out: str | None = None, old_report: str | None = None,
              targets=None) -> Path:
    """Measure `drafter` on its old target and on `target`; write and print the drift report; return its folder.

    old_report: an earlier `draftheads eval` folder of this drafter on the old target with these settings, used
    instead of measuring it again (what a served drafter has; one old measurement for many updates).
    targets: ((old model, tokenizer), (new model, tokenizer)) instead of loading them (tests)."""
    config = config or EvalConfig()
    DriftConfig(rows=rows)   # checked as --rows is, before any work
    check_report_folder(out, [drafter])
    paths = learned_paths([drafter])
    if len(paths) != 1:
        raise DraftheadsError(f"draftheads drift measures one learned drafter (a drafter or run folder, optionally "
                              f"+lookup or +suffix), got '{drafter}'")
    rows_folder = training_data(paths[0], data)
    if old_report:   # read and checked before minutes of loading two targets
        old_report = Path(old_report)
        check_same_settings(old_report, config)
    old_name = old_target or saved_target_name([drafter]) or "smollm2-135m"
    old_pair, new_pair = targets or (None, None)
    loading = dict(chat_template=config.chat_template, device=config.device)
    old_model, old_tok, _ = load_eval_target(old_name, config.dtype, [drafter], old_pair, **loading)
    new_model, new_tok, _ = load_eval_target(target, config.dtype, [drafter], new_pair, **loading)
    if old_tok.get_vocab() != new_tok.get_vocab():
        raise DraftheadsError(f"'{target}' has another tokenizer than '{old_name}'; a drafter cannot be carried over "
                              "between vocabularies: train a new one")
    print(f"draftheads drift: comparing {old_name} and {target} on {rows} rows of {rows_folder}", flush=True)
    shift = target_shift(old_model, new_model, load_rows(rows_folder), limit=rows)
    print(f"draftheads drift: top-1 agreement {shift.agreement:.3f}, KL {shift.kl:.3f} nats over {shift.positions} "
          "answer positions", flush=True)
    folder = report_folder(out, [drafter])
    if not old_report:
        old_report = run_eval([drafter], config, target=old_name, out=str(folder / "old"),
                              target_model=(old_model, old_tok))
        check_same_settings(old_report, config)
    new_report = run_eval([drafter], config, target=target, out=str(folder / "new"),
                          target_model=(new_model, new_tok))
    compared = compare(read_rows(old_report), read_rows(new_report), shift.agreement)
    report = {"created": now(), "drafter": drafter, "old_target": old_name, "new_target": target,
              "data": str(rows_folder), "shift": shift.to_dict(), "rows": compared,
              "reports": {"old": str(old_report), "new": str(new_report)}}
    plot_drift(compared, folder / "acceptance_by_depth.png")
    write_report(folder, report, format_drift(report))
    print(format_drift(report))
    print(f"draftheads drift: report in {folder}/report.md", flush=True)
    return folder


def check_same_settings(report: Path, config: EvalConfig) -> None:
    """An earlier old-target report stands in only if it measured what the new-target run will."""
    if not (report / "report.json").is_file():
        raise DraftheadsError(f"--old-report {report} holds no report.json; give a `draftheads eval` folder")
    saved = read_report(report)["settings"]
    asked = {"prompts": config.prompts, "limit": config.limit, "tree": config.tree, "accept": list(config.accept),
             "max_new_tokens": config.max_new_tokens, "temperatures": [float(t) for t in config.temperatures]}
    differ = [name for name, value in asked.items() if saved.get(name) != value]
    if differ:
        raise DraftheadsError(f"--old-report {report} was measured with other {', '.join(differ)} "
                              f"({', '.join(f'{n}={saved.get(n)}' for n in differ)}); measure both targets alike: "
                              "drop --old-report or give the same settings")


def training_data(drafter_path: str, data: str | None) -> Path:
    """--data, else the data folder the drafter's run recipe trained on."""
    if data:
        folder = Path(data)
    else:
        recipe = run_recipe(resolve_drafter_folder(drafter_path)) or {}
        output = (recipe.get("data") or {}).get("output")
        if not output:
            raise DraftheadsError(f"cannot tell which data '{drafter_path}' was trained on (no run recipe beside it); "
                                  "give --data FOLDER, a `draftheads data` folder the old target wrote")
        folder = Path(output)
    if not folder.is_dir():
        raise DraftheadsError(f"the drafter's training data '{folder}' is not there; give --data FOLDER, a "
                              "`draftheads data` folder the old target wrote")
    return check_finished(folder)   # its metadata read before the targets are loaded


def read_report(folder: Path) -> dict:
    """A `draftheads eval` folder's report.json (--old-report's, or the one this run just wrote)."""
    report = read_json(Path(folder) / "report.json", "eval report", "give --old-report the folder of an intact "
                       "`draftheads eval`, or drop --old-report to measure the old target again",
                       required=("settings", "results"))
    if not isinstance(report["settings"], dict) or not isinstance(report["results"], list):
        raise DraftheadsError(f"eval report {Path(folder) / 'report.json'} is damaged (its settings or results are "
                              "not what draftheads eval writes); drop --old-report to measure the old target again")
    return report


def read_rows(report_folder_path: Path) -> list[dict]:
    return read_report(report_folder_path)["results"]


def compare(old_rows: list[dict], new_rows: list[dict], agreement: float) -> list[dict]:
    """One row per (drafter, rule, temperature, batch size) measured on both targets."""
    new_by_key = {key(row): row for row in new_rows}
    out = []
    for old in old_rows:
        new = new_by_key.get(key(old))
        if new is None:
            continue
        out.append({"drafter": old["drafter"], "rule": old["rule"], "temperature": old["temperature"],
                    "tree": old["tree"], "tau_old": old["tau"], "tau_new": new["tau"],
                    # copying drafters propose from the text, not from what the old target would write
                    "tau_predicted": None if model_free(old["drafter"]) else predicted_tau(
                        old["tau"], old["accepted_hist"], agreement),
                    "speedup_old": old.get("speedup"), "speedup_new": new.get("speedup"),
                    "acceptance_old": old.get("acceptance_rates"), "acceptance_new": new.get("acceptance_rates")})
    return out


def key(row: dict) -> tuple:
    return row["drafter"], row["rule"], row["temperature"], row.get("batch_size", 1)


def predicted_tau(tau: float, histogram: list[int], agreement: float) -> float:
    """tau on the new target from the old target's accepted-length histogram ([n]: steps accepting exactly n drafts):
    each accepted depth kept with probability agreement (module docstring)."""
    steps = sum(histogram)
    if not steps:
        return tau
    at_least = [sum(histogram[k:]) / steps for k in range(1, len(histogram))]
    before = 1 + sum(at_least)
    after = 1 + sum(p * agreement ** (k + 1) for k, p in enumerate(at_least))
    return tau * after / before


def format_drift(report: dict) -> str:
    shift = report["shift"]
    lines = [f"# Drift: {report['drafter']} from {report['old_target']} to {report['new_target']}", "",
             f"Target shift on {shift['rows']} rows of {report['data']} ({shift['positions']} answer positions): "
             f"top-1 agreement {shift['agreement']:.3f}, KL(old || new) {shift['kl']:.3f} nats, the new target's "
             f"top-1 equal to the rows' tokens {shift['new_accuracy']:.3f} (old: {shift['old_accuracy']:.3f}).", "",
             "| drafter | rule | T | tau old | tau new | predicted | drop | speedup old | speedup new | "
             "acceptance by depth, old / new |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        depth = " / ".join(" ".join(f"{a:.2f}" for a in (row[k] or [])[:5]) for k in ("acceptance_old",
                                                                                     "acceptance_new"))
        lines.append(f"| {row['drafter']} | {row['rule']} | {row['temperature']:g} | {row['tau_old']:.2f} | "
                     f"{row['tau_new']:.2f} | {number(row['tau_predicted'])} | "
                     f"{1 - row['tau_new'] / row['tau_old']:.0%} | {speed(row['speedup_old'])} | "
                     f"{speed(row['speedup_new'])} | {depth} |")
    lines += ["", "![acceptance by depth](acceptance_by_depth.png)", "",
              f"Full reports: {report['reports']['old']}/report.md, {report['reports']['new']}/report.md", ""]
    return "\n".join(lines)


def number(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def speed(value) -> str:
    return "-" if value is None else f"{value:.2f}x"
