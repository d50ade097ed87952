"""The speedup each drafter x rule is predicted to reach, made before the evaluated prompts run: tau, nodes and
draft time per step measured on the calibration prompts (or tau and nodes from an earlier evaluation of the same
drafter, tree and rule), verify and rule costs from the machine's profile (evaluation/cost_model.py); and the
report's columns that set the prediction beside what was measured."""

from __future__ import annotations

from dataclasses import dataclass

from draftheads.decoding.stats import GenerationStats
from draftheads.evaluation.conversations import EvalSettings
from draftheads.evaluation.cost_model import StepShape, predict
from draftheads.evaluation.earlier_report import EarlierReport
from draftheads.evaluation.entries import Entry
from draftheads.evaluation.measure import RunConfig, generate_conversations
from draftheads.evaluation.profile import rule_setting

UNIT_TOKENS = 32   # plain decode steps timed right before each drafter's calibration runs: the unit of its costs


@dataclass
class Forecast:
    """What the cost model needs for one drafter x rule besides a step's shape: the machine's profile, the rule's
    cost names, the drafter's draft time per step, the prompts' lengths and the tokens expected per prompt."""

    profile: object
    setting: str
    plain_setting: str
    draft_steps: float      # draft time per step / plain decode step, both timed on the calibration prompts
    observe_steps: float    # reading a prompt, per token, in the same unit
    lengths: list[int]
    new_tokens: int
    calibrated: StepShape   # the acceptance the prediction is made from
    source: str             # where that acceptance was measured

    def speedup(self, shape: StepShape) -> dict:
        return predict(self.profile, None, shape, self.lengths, self.new_tokens, self.setting, self.plain_setting,
                       draft_steps=self.draft_steps, observe_steps=self.observe_steps)


def predict_entries(model, tokenizer, entries: list[Entry], configs: list[RunConfig], calibration,
                    settings: EvalSettings, profile, lengths: list[int], earlier: EarlierReport | None = None) -> dict:
    """(drafter, rule, temperature) -> its Forecast."""
    out = {}
    for cfg in configs:
        setting = rule_setting(cfg.rule, cfg.temperature, settings.top_k, settings.top_p)
        plain_setting = rule_setting("strict" if cfg.sampled else "greedy", cfg.temperature, settings.top_k,
                                     settings.top_p)
        for entry in entries:
            # a few plain decode steps right before each drafter's runs: their time is the unit of its draft costs
            plain = generate_conversations(model, tokenizer, calibration[:1], None, RunConfig(
                "greedy" if not cfg.sampled else "strict", cfg.plain_key), settings,
                max_new_tokens=UNIT_TOKENS)[0].stats
            stats = GenerationStats.merged(r.stats for r in generate_conversations(model, tokenizer, calibration, entry,
                                                                                   cfg, settings))
            if not (stats.steps and plain.steps):
                continue
            step = plain.decode_s / plain.steps
            shape, source = StepShape(stats.tau, sum(stats.step_nodes) / stats.steps, entry.depth), "calibration"
            measured = (earlier.shape(entry.name, cfg.rule, cfg.temperature, entry.info["tree"], entry.depth)
                        if earlier else None)
            if measured:
                shape, source = measured, "earlier evaluation"
            elif earlier:
                print(f"draftheads eval: {entry.name} {cfg.rule} T={cfg.temperature:g}: {earlier.describe()} has no "
                      f"row with tree {entry.info['tree']}; predicting from the calibration prompts", flush=True)
            out[(entry.name, cfg.rule, cfg.temperature)] = Forecast(
                profile, setting, plain_setting, stats.mean_draft_s / step,
                stats.draft_prefill_s / max(1, stats.prompt_tokens) / step, lengths,
                round(stats.new_tokens / max(1, len(calibration))), shape, source)
    return out


def prediction_columns(forecast: Forecast | None, row: dict) -> dict:
    """The row's predicted figures and their errors against what was measured: `predicted_*` from the calibration
    prompts' acceptance (made before the run); `cost_model_*` the same cost model given the acceptance this run
    measured (tau and nodes per step, not its timings), which isolates the error of the costs from that of tau."""
    none = {"predicted_speedup": None, "prediction_error": None, "predicted_tau": None, "predicted_from": None,
            "cost_model_speedup": None, "cost_model_error": None}
    if forecast is None or row.get("batch_size", 1) != 1:   # the profile times one sequence
        return none
    before = forecast.speedup(forecast.calibrated)
    given = forecast.speedup(StepShape(row["tau"], row["mean_nodes"], forecast.calibrated.depth))
    measured = row.get("speedup")
    return {"predicted_speedup": before["speedup"], "predicted_tau": before["tau"], "predicted_from": forecast.source,
            "predicted_verify_cost": before["verify_cost"], "predicted_draft_cost": before["draft_cost"],
            "prediction_error": before["speedup"] / measured - 1 if measured else None,
            "cost_model_speedup": given["speedup"],
            "cost_model_error": given["speedup"] / measured - 1 if measured else None}
