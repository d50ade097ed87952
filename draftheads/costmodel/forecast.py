"""The speedup each drafter x rule is predicted to reach, made before the evaluated prompts run, with a range: tau,
nodes and draft time per step measured on the calibration prompts (or tau and nodes from an earlier evaluation of
the same drafter, tree and rule), verify and rule costs from the machine's profile (costmodel/cost_model.py); and
the report's columns that set the prediction beside what was measured.

Where the prompts have task kinds, each kind is predicted from the calibration prompts of its own kind (those it
has), and the kinds' times are summed. The range covers the two errors a prediction makes:

    acceptance  the evaluated prompts' mean is not the calibration prompts': the speedup predicted from each
                calibration prompt's own tau and nodes varies with sd s over n of them, so the mean over N
                evaluated prompts lies within t(95%, n - 1) * s * sqrt(1/n + 1/N) of the prediction
    costs       what the cost model was off by on the calibration prompts' own steps (their measured step time
                against what the profile says those steps cost, tau aside)

combined as relative half-widths in quadrature. An earlier evaluation's tau has no per-prompt spread here: its range
is the costs' alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from draftheads.costmodel.calibration import Calibration
from draftheads.costmodel.cost_model import StepShape, predict
from draftheads.costmodel.earlier_report import EarlierReport
from draftheads.costmodel.profile import rule_setting
from draftheads.decoding.stats import GenerationStats
from draftheads.measurement.entries import Entry
from draftheads.measurement.measure import RunConfig

UNIT_TOKENS = 32   # plain decode steps timed right before each drafter's calibration runs: the unit of its costs
# Student's t at 97.5% (a two-sided 95% range) by degrees of freedom; past the table, the normal 1.96
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       15: 2.131, 20: 2.086, 30: 2.042}


def t95(degrees: int) -> float:
    return T95.get(degrees) or next((T95[d] for d in sorted(T95) if d >= degrees), 1.96)


@dataclass
class Forecast:
    """What the cost model needs for one drafter x rule besides a step's shape: the machine's profile, the rule's
    cost names, the drafter's draft time per step, the prompts' lengths (and kinds) and the tokens expected per
    prompt; and what the range is made from."""

    profile: object
    setting: str
    plain_setting: str
    draft_steps: float      # draft time per step / plain decode step, both timed on the calibration prompts
    observe_steps: float    # reading a prompt, per token, in the same unit
    lengths: list[int]
    new_tokens: int
    calibrated: StepShape   # the acceptance the prediction is made from
    source: str             # where that acceptance was measured
    kinds: list[str] = field(default_factory=list)                    # each evaluated prompt's kind ('' for none)
    by_kind: dict[str, StepShape] = field(default_factory=dict)       # the calibration prompts' acceptance per kind
    prompt_shapes: list[StepShape] = field(default_factory=list)      # each calibration prompt's own acceptance
    cost_error: float = 0.0  # the cost model's relative error on the calibration prompts' own steps
    batch: object = None     # the target's BatchProfile (costmodel/batch_profile.py): predictions at batch size > 1

    def speedup(self, shape: StepShape, lengths: list[int] | None = None, rows: int = 1) -> dict:
        return predict(self.profile, None, shape, self.lengths if lengths is None else lengths, self.new_tokens,
                       self.setting, self.plain_setting, draft_steps=self.draft_steps,
                       observe_steps=self.observe_steps, batch=self.batch, rows=rows)

    def predicted(self, rows: int = 1) -> dict:
        """The prediction at batch size `rows`: each task kind from its own calibration prompts where it has some,
        summed over kinds."""
        kinds = sorted(set(self.kinds))
        if self.source != "calibration" or not all(kind in self.by_kind for kind in kinds) or kinds in ([], [""]):
            return self.speedup(self.calibrated, rows=rows)
        parts = [self.speedup(self.by_kind[kind], [n for n, k in zip(self.lengths, self.kinds) if k == kind], rows)
                 for kind in kinds]
        plain, spec = sum(p["plain_s"] for p in parts), sum(p["spec_s"] for p in parts)
        counts = [self.kinds.count(kind) for kind in kinds]
        tau = sum(counts) / sum(n / self.by_kind[kind].tau for n, kind in zip(counts, kinds))   # tokens / steps
        return {**parts[0], "speedup": plain / spec, "tau": tau, "plain_s": plain, "spec_s": spec,
                "verify_cost": statistics.fmean(p["verify_cost"] for p in parts),
                "draft_cost": statistics.fmean(p["draft_cost"] for p in parts)}

    def plain_above(self, largest: int) -> int:
        """`--plain-above auto`: the most live rows (up to `largest`) at which speculation is predicted to pay,
        every smaller count paying too; 0 when it does not pay even for one row."""
        paying = 0
        while paying < largest and self.predicted(paying + 1)["speedup"] > 1:
            paying += 1
        return paying

    def interval(self, center: float) -> tuple[float, float]:
        """The 95% range around `center` (see the module's docstring)."""
        each = [self.speedup(shape)["speedup"] for shape in self.prompt_shapes] if self.source == "calibration" else []
        acceptance = 0.0
        if len(each) >= 2:
            spread = t95(len(each) - 1) * statistics.stdev(each) * math.sqrt(1 / len(each) + 1 / len(self.lengths))
            acceptance = spread / statistics.fmean(each)
        half = math.hypot(acceptance, self.cost_error)
        return center * max(0.0, 1 - half), center * (1 + half)


def step_shape(stats: GenerationStats, depth: int) -> StepShape:
    return StepShape(stats.tau, sum(stats.step_nodes) / stats.steps, depth)


def cost_error(profile, stats: GenerationStats, plain: GenerationStats, setting: str, plain_setting: str) -> float:
    """How far the profile's costs were from the calibration prompts' own steps: their measured step (draft and
    verify) over the plain step timed beside them, against what the profile says such steps cost, minus 1."""
    context = sum(stats.step_context) / stats.steps
    nodes = sum(stats.step_nodes) / stats.steps
    plain_context = sum(plain.step_context) / plain.steps
    unit = plain.decode_s / plain.steps
    verify = profile.forward(nodes, context) + profile.rule(setting, nodes)
    plain_step = profile.decode_step(plain_context) + profile.rule(plain_setting, 1)
    expected = verify / plain_step + stats.mean_draft_s / unit
    return (stats.mean_draft_s + stats.mean_verify_s) / unit / expected - 1


def predict_entries(cal: Calibration, entries: list[Entry], configs: list[RunConfig],
                    earlier: EarlierReport | None = None, kinds: list[str] | None = None, batch=None) -> dict:
    """(drafter, rule, temperature) -> its Forecast. kinds: each evaluated prompt's task kind (cal.lengths' order);
    batch: the target's BatchProfile, for predictions at batch size > 1."""
    out = {}
    calibration, profile, lengths, shared = cal.conversations, cal.profile, cal.lengths, cal.settings.decode
    for cfg in configs:
        setting = rule_setting(cfg.rule, cfg.temperature, shared.top_k, shared.top_p)
        plain_setting = rule_setting("strict" if cfg.sampled else "greedy", cfg.temperature, shared.top_k,
                                     shared.top_p)
        for entry in entries:
            # a few plain decode steps right before each drafter's runs: their time is the unit of its draft costs
            plain = cal.runs(None, RunConfig("greedy" if not cfg.sampled else "strict", cfg.plain_key), calibration[:1],
                             max_new_tokens=UNIT_TOKENS)[0].stats
            each = [r.stats for r in cal.runs(entry, cfg)]
            stats = GenerationStats.merged(each)
            if not (stats.steps and plain.steps):
                continue
            step = plain.decode_s / plain.steps
            shape, source = step_shape(stats, entry.depth), "calibration"
            measured = (earlier.shape(entry.name, cfg.rule, cfg.temperature, entry.info["tree"], entry.depth)
                        if earlier else None)
            if measured:
                shape, source = measured, "earlier evaluation"
            elif earlier:
                print(f"draftheads eval: {entry.name} {cfg.rule} T={cfg.temperature:g}: {earlier.describe()} has no "
                      f"row with tree {entry.info['tree']}; predicting from the calibration prompts", flush=True)
            by_kind = {}
            for kind in {c.kind for c in calibration}:
                merged = GenerationStats.merged(r for r, c in zip(each, calibration) if c.kind == kind)
                if merged.steps:
                    by_kind[kind] = step_shape(merged, entry.depth)
            out[(entry.name, cfg.rule, cfg.temperature)] = Forecast(
                profile, setting, plain_setting, stats.mean_draft_s / step,
                stats.draft_prefill_s / max(1, stats.prompt_tokens) / step, lengths,
                round(stats.new_tokens / max(1, len(calibration))), shape, source, list(kinds or [""] * len(lengths)),
                by_kind, [step_shape(r, entry.depth) for r in each if r.steps],
                cost_error(profile, stats, plain, setting, plain_setting), batch)
    return out


def prediction_columns(forecast: Forecast | None, row: dict) -> dict:
    """The row's predicted figures and their errors against what was measured: `predicted_*` from the calibration
    prompts' acceptance (made before the run); `cost_model_*` the same cost model given the acceptance this run
    measured (tau and nodes per step, not its timings), which isolates the error of the costs from that of tau."""
    none = {"predicted_speedup": None, "prediction_error": None, "predicted_tau": None, "predicted_from": None,
            "predicted_range": None, "in_predicted_range": None, "cost_model_speedup": None, "cost_model_error": None}
    rows = row.get("batch_size", 1)
    if forecast is None or (rows > 1 and forecast.batch is None):
        return none
    before = forecast.predicted(rows)
    low, high = forecast.interval(before["speedup"])
    given = forecast.speedup(StepShape(row["tau"], row["mean_nodes"], forecast.calibrated.depth), rows=rows)
    measured = row.get("speedup")
    return {"predicted_speedup": before["speedup"], "predicted_tau": before["tau"], "predicted_from": forecast.source,
            "predicted_range": [low, high], "in_predicted_range": low <= measured <= high if measured else None,
            "calibration_cost_error": forecast.cost_error,
            "predicted_verify_cost": before["verify_cost"], "predicted_draft_cost": before["draft_cost"],
            "prediction_error": before["speedup"] / measured - 1 if measured else None,
            "cost_model_speedup": given["speedup"],
            "cost_model_error": given["speedup"] / measured - 1 if measured else None}
