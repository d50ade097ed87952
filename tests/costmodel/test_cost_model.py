"""The cost profile (costmodel/profile.py) and the predictions made from it (costmodel/cost_model.py)."""

from __future__ import annotations

import json

import pytest
import torch

import draftheads.costmodel.profile as profile_module
from draftheads.core.tree import Tree
from draftheads.costmodel.auto_tree import expected_accepted
from draftheads.costmodel.cost_model import StepShape, fastest_tree, predict
from draftheads.costmodel.profile import (
    DrafterProfile,
    TargetProfile,
    drafter_profile,
    fit_costs,
    interpolate,
    rule_setting,
    target_profile,
)
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.settings import DecodeSettings
from tests.decoding.stubs import RandomDrafter
from tests.fixtures import make_target, make_tokenizer


def synthetic(per_token: float, step: float = 0.01) -> TargetProfile:
    """A target whose forward costs step + per_token * (queries - 1) at any context."""
    queries = [1, 2, 4, 8, 16, 32, 64]
    row = [step + per_token * (q - 1) for q in queries]
    return TargetProfile({}, [0, 1024], queries, [row, row], {"greedy": [0.0] * len(queries)})


def test_interpolation_is_linear_between_points_and_extends_the_end_lines():
    assert interpolate([1, 2, 4], [1.0, 2.0, 6.0], 3) == pytest.approx(4.0)
    assert interpolate([1, 2, 4], [1.0, 2.0, 6.0], 8) == pytest.approx(14.0)      # slope of the last segment
    assert interpolate([1, 2, 4], [1.0, 2.0, 6.0], 0) == pytest.approx(0.0)       # slope of the first
    assert interpolate([1, 2, 4], [1.0, None, 6.0], 2) == pytest.approx(8 / 3)    # a cell that did not fit


def test_target_profile_reads_a_grid_by_queries_and_context():
    profile = TargetProfile({}, [0, 100, 200], [1, 10], [[1.0, 2.0], [3.0, 5.0], [4.0, 7.0]])
    assert profile.forward(10, 150) == pytest.approx(6.0) and profile.decode_step(100) == 3.0
    assert profile.forward(10, 50) == 5.0   # below the shortest cache: its row, never the prefill row (another path)
    assert profile.prefill(10) == 2.0 and profile.rule("strict T=1 k=0 p=1", 4) == 0.0   # unmeasured rule: no cost


def test_a_noisy_row_on_a_cache_is_read_through_its_line():
    """One lucky fast cell at 1 token must not make every verify look dear: on a cache, up to 64 tokens, the row's
    least-squares line is read; prefills (context 0) and bigger forwards keep the cells."""
    queries = [1, 2, 4, 8, 16, 32, 64, 128]
    line = [0.08 + 0.0008 * (q - 1) for q in queries]
    noisy = list(line)
    noisy[0] -= 0.012                                   # the fastest of a few runs at 1 token was lucky
    profile = TargetProfile({}, [0, 1024], queries, [noisy, noisy])
    assert profile.forward(11, 1024) / profile.decode_step(1024) == pytest.approx(1.1, abs=0.02)
    assert profile.prefill(1) == pytest.approx(noisy[0]) and profile.forward(128, 1024) == pytest.approx(noisy[-1])


def test_prediction_matches_a_hand_computation():
    """plain 2 prompts x (prefill 0.01 + 10 x 0.01); spec: tau 2, 5 nodes (0.01 + 4 x 0.002), draft 0.004."""
    target = synthetic(per_token=0.002)
    figures = predict(target, None, StepShape(2.0, 5, 2), [1, 1], 10, "greedy", draft_steps=0.4)
    plain, spec = 2 * (0.01 + 10 * 0.01), 2 * (0.01 + 5 * (0.018 + 0.004))
    assert figures["speedup"] == pytest.approx(plain / spec)
    assert figures["verify_cost"] == pytest.approx(1.8) and figures["draft_cost"] == pytest.approx(0.4)


def test_the_fastest_tree_shrinks_when_verifying_gets_dearer():
    table = [[0.7, 0.15, 0.05], [0.6, 0.1], [0.5, 0.1], [0.4]]
    drafter = DrafterProfile({}, 0.0, 0.001, 0.0, 0.0, plain_step_s=0.01)
    free, _ = fastest_tree(synthetic(per_token=0.0), drafter, table, [64], 128, max_budget=16)
    dear, figures = fastest_tree(synthetic(per_token=0.004), drafter, table, [64], 128, max_budget=16)
    assert free.num_nodes == 17 and dear.paths == Tree.chain(1).paths     # all 16 nodes when they cost nothing
    assert figures["tau"] == pytest.approx(1 + expected_accepted(dear, table))


def test_least_squares_separates_level_and_node_costs():
    points = [(d, n, 0.001 + 0.002 * d + 0.0001 * n) for d, n in [(1, 2), (4, 5), (4, 17), (2, 9)]]
    assert fit_costs(points) == pytest.approx((0.001, 0.002, 0.0001), abs=1e-9)


def test_rules_at_temperature_zero_are_the_greedy_rule():
    model = make_target("llama", make_tokenizer("chatml"))
    strict = DecodeSettings(rule="strict", temperature=0.0)
    assert strict.rule == "strict" and strict.applied_rule == "greedy"   # the rule asked for, and the one run
    assert DecodeSettings(rule="typical", temperature=0.7).applied_rule == "typical"
    assert rule_setting("strict", 0.0) == "greedy" and rule_setting("typical", 0.5, 4, 0.9) == "typical T=0.5 k=4 p=0.9"
    prompt, drafter = torch.tensor([[2, 5, 7, 3, 9]]), RandomDrafter(model.config.vocab_size, tree=Tree.chain(2))
    greedy = speculative_generate(model, drafter, prompt, 8, accept="greedy", eos_token_id=[])
    for rule in ("strict", "typical"):
        assert speculative_generate(model, drafter, prompt, 8, accept=rule, temperature=0.0,
                                    eos_token_id=[]).tokens.tolist() == greedy.tokens.tolist()


def test_profiles_are_measured_once_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTHEADS_PROFILES", str(tmp_path))
    model = make_target("llama", make_tokenizer("chatml"))
    calls = []
    real = profile_module.measure_forwards
    monkeypatch.setattr(profile_module, "measure_forwards",
                        lambda m, **kw: calls.append(1) or real(m, contexts=(0, 16), queries=(1, 4), repeats=1))
    first = target_profile(model, rules=[("strict", 0.7, 0, 1.0)], progress=lambda _: None)
    again = target_profile(model, rules=[("strict", 0.7, 0, 1.0)], progress=lambda _: None)
    assert calls == [1] and again.forward_s == first.forward_s and "strict T=0.7 k=0 p=1" in again.rule_s
    assert all(t > 0 for row in first.forward_s for t in row)
    saved = json.loads(next(tmp_path.glob("target-*.json")).read_text())
    assert saved["key"]["dtype"] == "float32" and saved["key"]["threads"] == torch.get_num_threads()
    target_profile(model, refresh=True, progress=lambda _: None)
    assert calls == [1, 1]
    target_profile(make_target("llama", make_tokenizer("chatml"), seed=1), progress=lambda _: None)
    assert calls == [1, 1, 1]     # other weights: another profile (the drafter profiles keyed on it differ too)


def test_a_drafter_profile_fits_its_probe_steps(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTHEADS_PROFILES", str(tmp_path))
    model = make_target("llama", make_tokenizer("chatml"))
    drafter = RandomDrafter(model.config.vocab_size)
    costs = drafter_profile(model, drafter, prompt=torch.tensor([2, 5, 7, 3, 9]), name="random", key={"d": 1},
                            new_tokens=6, progress=lambda _: None)
    assert [p["nodes"] for p in costs.probes] == [2, 5, 17] and costs.step(4, 17) >= 0
    again = drafter_profile(model, drafter, prompt=torch.tensor([2, 5, 7, 3, 9]), name="random", key={"d": 1},
                            new_tokens=6, progress=lambda _: None)
    assert again == costs    # read back from the cache


def test_a_profile_row_is_made_monotone_in_the_tokens():
    """A cell slowed by another process (the 4-token one here) is lowered to the next larger one's time."""
    assert profile_module.monotone([0.05, 0.06, 0.078, 0.052, None, 0.09]) == [0.05, 0.052, 0.052, 0.052, None, 0.09]


# ---------------------------------------------------------------- the prediction and its range


def forecast(**kw):
    from draftheads.costmodel.forecast import Forecast

    base = dict(profile=synthetic(0.001), setting="greedy", plain_setting="greedy", draft_steps=0.1, observe_steps=0.0,
                lengths=[100] * 4, new_tokens=64, calibrated=StepShape(2.0, 5, 4), source="calibration")
    return Forecast(**{**base, **kw})


def test_each_kind_is_predicted_from_its_own_calibration_prompts():
    """Two kinds, one copied (tau 4) and one not (tau 1.2): the sum of the kinds' times, not the merged tau."""
    shapes = {"copy": StepShape(4.0, 5, 4), "write": StepShape(1.2, 5, 4)}
    mixed = forecast(kinds=["copy", "write", "write", "write"], by_kind=shapes)
    copy, write = (forecast().speedup(shapes[k], lengths) for k, lengths in (("copy", [100]), ("write", [100] * 3)))
    expected = (copy["plain_s"] + write["plain_s"]) / (copy["spec_s"] + write["spec_s"])
    assert mixed.predicted()["speedup"] == pytest.approx(expected)
    assert mixed.predicted()["tau"] == pytest.approx(4 / (1 / 4 + 3 / 1.2))            # tokens over steps
    # a kind without calibration prompts of its own: the merged calibration acceptance, as without kinds
    partial = forecast(kinds=["copy", "other", "other", "other"], by_kind=shapes)
    assert partial.predicted()["speedup"] == pytest.approx(forecast().speedup(StepShape(2.0, 5, 4))["speedup"])


def test_the_range_widens_with_the_calibration_spread_and_the_cost_error():
    tight = forecast(prompt_shapes=[StepShape(2.0, 5, 4)] * 6)
    assert tight.interval(1.5) == pytest.approx((1.5, 1.5))
    spread = [StepShape(t, 5, 4) for t in (1.2, 1.6, 2.0, 2.4, 2.8, 3.2)]
    each = [forecast().speedup(s)["speedup"] for s in spread]
    import statistics
    half = 2.571 * statistics.stdev(each) * (1 / 6 + 1 / 4) ** 0.5 / statistics.fmean(each)
    assert forecast(prompt_shapes=spread).interval(1.5) == pytest.approx((1.5 * (1 - half), 1.5 * (1 + half)))
    both = forecast(prompt_shapes=spread, cost_error=-0.1).interval(1.5)
    assert both[1] == pytest.approx(1.5 * (1 + (half ** 2 + 0.01) ** 0.5))
    # an earlier evaluation's tau carries no per-prompt spread: the costs' error alone
    assert forecast(prompt_shapes=spread, source="earlier evaluation", cost_error=0.2).interval(1.0) == \
        pytest.approx((0.8, 1.2))



# ---------------------------------------------------------------- batch size > 1


def batch_profile_of(cost) -> "BatchProfile":
    """A batch profile whose forward of b rows x n tokens takes cost(b, n)."""
    from draftheads.costmodel.batch_profile import BatchProfile

    batches, queries = [1, 2, 4, 8, 16], [1, 2, 4, 8, 16, 32]
    return BatchProfile({}, batches, queries, [[cost(b, n) for n in queries] for b in batches])


def test_the_batch_factor_interpolates_rows_and_tokens():
    profile = batch_profile_of(lambda b, n: b * (1 + 0.1 * n))
    assert profile.factor(1, 5) == 1.0 and profile.factor(4, 8) == pytest.approx(4.0)
    assert profile.factor(3, 8) == pytest.approx(3.0) and profile.factor(16, 2) == pytest.approx(16.0)
    flat = batch_profile_of(lambda b, n: 1 + 0.1 * n)
    assert flat.factor(16, 4) == pytest.approx(1.0)


def test_batch_predictions_scale_the_forwards_and_charge_each_row_its_drafting():
    shape, target = StepShape(2.0, 5, 4), synthetic(0.001)
    one = predict(target, None, shape, [100], 64, "greedy", draft_steps=0.2, observe_steps=0.0)
    # rows that cost their sum (a CPU): each row pays what it paid alone
    linear = batch_profile_of(lambda b, n: b * (0.01 + 0.001 * (n - 1)))
    assert predict(target, None, shape, [100], 64, "greedy", draft_steps=0.2, observe_steps=0.0, batch=linear,
                   rows=8)["speedup"] == pytest.approx(one["speedup"])
    # rows that cost nothing extra (a GPU far from its limit): forwards shrink per row, drafting does not
    free = batch_profile_of(lambda b, n: 0.01 + 0.001 * (n - 1))
    got = predict(target, None, shape, [100], 64, "greedy", draft_steps=0.2, observe_steps=0.0, batch=free, rows=4)
    step, verify, draft = 0.01 / 4, (0.01 + 0.004) / 4, 0.2 * 0.01
    prefill = target.prefill(100)
    assert got["speedup"] == pytest.approx((prefill + 64 * step) / (prefill + 32 * (verify + draft)))
    with pytest.raises(Exception, match="batch profile"):
        predict(target, None, shape, [100], 64, "greedy", rows=2)


def test_auto_plain_above_is_the_last_row_count_that_pays():
    """Batched plain steps are free and verifies compute-bound: speculation pays for few rows only."""
    bound = batch_profile_of(lambda b, n: 0.01 + 0.004 * b * (n - 1))
    ahead = forecast(batch=bound, draft_steps=0.0)
    paying = [rows for rows in range(1, 17) if ahead.predicted(rows)["speedup"] > 1]
    assert paying and paying == list(range(1, len(paying) + 1)) and len(paying) < 16
    assert ahead.plain_above(16) == len(paying) and ahead.plain_above(1) == 1
    assert forecast(batch=bound, calibrated=StepShape(1.0, 5, 4)).plain_above(16) == 0   # never pays
