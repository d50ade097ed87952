"""`draftheads eval --batch-size`: batched conversations give each row what it gets alone, every batch size
sees every prompt once per job with the seeds of batch size 1, and the speedup-vs-batch curve (table, plot,
'stops paying at') is built from the measured rows."""

from __future__ import annotations

import dataclasses
import json

import pytest

import draftheads.measurement.measure as measure_module
from draftheads.core.config import build
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.report import format_batch_table
from draftheads.evaluation.summary import batch_curve
from draftheads.measurement.conversations import Conversation
from draftheads.measurement.entries import Entry
from draftheads.measurement.measure import RunConfig, generate_conversations, measure
from tests.decoding.stubs import RandomDrafter
from tests.evaluation.test_evaluate import PROMPTS, eagle_run, fixture, md_table, settings  # noqa: F401 (fixture)


def random_entry(model, tree=Tree.chain(3)) -> Entry:
    return Entry("random", "learned", RandomDrafter(model.config.vocab_size, seed=3, tree=tree), None, tree.depth,
                 {"tree": "chain:3"})


def test_batched_conversations_equal_each_alone(monkeypatch):
    """Greedy in fp32, conversations of different lengths and turn counts (each reply ends its turn, so rows leave
    the batch after their last turn): the batch's replies are each conversation's alone."""
    model, tokenizer = fixture()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    real, batches = measure_module.generate, []

    def replies_that_end_their_turn(target, drafter, prompts, settings, **kw):
        batches.append(len(prompts))
        out = real(target, drafter, prompts, dataclasses.replace(settings, eos_token_id=[]), **kw)
        out.rows = [row + [end] for row in out.rows]
        return out

    monkeypatch.setattr(measure_module, "generate", replies_that_end_their_turn)
    convs = [Conversation(0, [PROMPTS[0], "Now make it recursive."], None), Conversation(1, [PROMPTS[1]], "Be brief."),
             Conversation(2, ["Hi", "And again?", "Once more."], None)]
    sett = settings(5, stop_ids=[end])
    for entry in (None, random_entry(model)):
        batches.clear()
        together = generate_conversations(model, tokenizer, convs, entry, RunConfig("greedy", 0.0), sett)
        assert batches == [3, 2, 1] and [o.stats.prompts for o in together] == [2, 1, 3]
        for conv, out in zip(convs, together):
            alone = generate_conversations(model, tokenizer, [conv], entry, RunConfig("greedy", 0.0), sett)[0]
            assert out.tokens == alone.tokens and out.stats.step_emitted == alone.stats.step_emitted


def test_every_batch_size_sees_every_prompt_once_with_the_seeds_of_batch_size_one(monkeypatch):
    model, tokenizer = fixture()
    real, calls = measure_module.generate, []

    def recorded(target, drafter, prompts, settings, **kw):
        calls.append((drafter is None, len(prompts), list(kw["seed"]), kw["plain_above"]))
        return real(target, drafter, prompts, settings, **kw)

    monkeypatch.setattr(measure_module, "generate", recorded)
    convs = [Conversation(i, [PROMPTS[i % 2]], None) for i in range(5)]
    entry = random_entry(model)
    found = measure(model, tokenizer, convs, [entry], [RunConfig("greedy", 0.0)], settings(5, seed=7), progress=False,
                    batch_sizes=[1, 2, 4], plain_above=3)
    timed = calls[4:]   # warm-up first: plain and the drafter at batch sizes 1 and 4
    assert [(n, plain) for plain, n, _, _ in calls[:4]] == [(1, True), (1, False), (4, True), (4, False)]
    # blocks of 4 prompts: B=1 x4, B=2 x2, B=4 x1, then (reversed) B=4, B=2, B=1 for the fifth prompt
    sizes = [n for plain, n, _, _ in timed if plain]
    assert sizes == [1, 1, 1, 1, 2, 2, 4, 1, 1, 1]
    assert all(plain_above == 3 for *_, plain_above in timed)
    seen = {}
    for plain, n, seeds, _ in timed:
        seen.setdefault(plain, []).extend(seeds)
    assert sorted(seen[True]) == sorted(seen[False]) == sorted([7 + 1000 * i for i in range(5)] * 3)
    assert sorted(found) == [1, 2, 4]
    for size, at_size in found.items():
        assert len(at_size.plain[0.0]) == len(at_size.spec[("random", RunConfig("greedy", 0.0))]) == 5
        # fp32 greedy: the same text at every batch size
        assert ([o.tokens for o in at_size.spec[("random", RunConfig("greedy", 0.0))]]
                == [o.tokens for o in found[1].plain[0.0]])


def curve_rows(speedups: dict[int, float | None]) -> list[dict]:
    return [{"drafter": "d", "rule": "greedy", "temperature": 0.0, "tree": "chain:3", "batch_size": b, "speedup": s,
             "tau": 2.0, "tokens_per_s_plain": 10.0 * b, "tokens_per_s_spec": 10.0 * b * (s or 0)}
            for b, s in speedups.items()]


@pytest.mark.parametrize("speedups,stops", [
    ({1: 1.5, 2: 1.2, 4: 0.9, 8: 0.7}, 4),
    ({1: 0.8, 2: 1.1}, 1),                 # the smallest size below 1, even when a bigger one recovers
    ({4: 1.3, 1: 1.6, 2: 1.4}, None),      # pays everywhere measured; order of the rows does not matter
    ({1: 1.2, 2: None, 4: 0.99}, 4),       # a size without a speedup (no tokens) is not a stop
])
def test_stops_paying_at_is_the_smallest_batch_size_below_one(speedups, stops):
    (curve,) = batch_curve(curve_rows(speedups))
    assert curve["stops_paying_at"] == stops
    assert curve["batch_sizes"] == sorted(speedups)
    table = md_table(format_batch_table([curve]))
    assert table[0][-1] == "stops paying at" and table[0][4:-1] == [f"B={b}" for b in sorted(speedups)]
    assert table[1][-1] == (f"B={stops}" if stops else f"pays up to B={max(speedups)}")
    assert table[2][0] == "plain greedy tok/s" and table[2][4] == f"{10.0 * min(speedups):.1f}"


def test_run_eval_reports_the_speedup_vs_batch_curve(eagle_run, tmp_path, capsys):
    folder, prompts = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts=str(prompts), accept=["greedy"], tree="chain:2", max_new_tokens=6,
                                             batch_sizes=[2, 1]),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    rows = report["results"]
    assert report["settings"]["batch_sizes"] == [1, 2] and report["settings"]["plain_above"] is None
    assert [(r["drafter"], r["batch_size"]) for r in rows] == [("prompt-lookup", 1), ("eagle-tiny", 1),
                                                               ("prompt-lookup", 2), ("eagle-tiny", 2)]
    assert all(r["greedy_mismatches"] == 0 for r in rows)                # fp32: batched speculative == plain
    assert [r["tau"] for r in rows[:2]] == [r["tau"] for r in rows[2:]]   # the same drafts accepted at batch size 2
    assert sorted(report["plain"]) == ["B=1 greedy", "B=2 greedy"]
    curves = report["batch_curve"]
    assert [(c["drafter"], c["batch_sizes"]) for c in curves] == [("prompt-lookup", [1, 2]), ("eagle-tiny", [1, 2])]
    assert [c["speedup"] for c in curves] == [[rows[0]["speedup"], rows[2]["speedup"]],
                                              [rows[1]["speedup"], rows[3]["speedup"]]]
    assert "speedup_vs_batch.png" in report["plots"]
    assert (out / "speedup_vs_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert md_table(md)[0][4] == "B" and "## Speedup vs batch size" in md
    printed = capsys.readouterr().out
    assert "| eagle-tiny | greedy | 0 | chain:2 | " in printed and "stops paying at" in printed


def test_batch_size_one_reports_as_before(eagle_run, tmp_path):
    folder, prompts = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts=str(prompts), max_new_tokens=4),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    assert report["batch_curve"] == [] and sorted(report["plain"]) == ["greedy"]
    assert "speedup_vs_batch.png" not in report["plots"] and "Speedup vs batch" not in (out / "report.md").read_text()


@pytest.mark.parametrize("sizes,plain_above,message", [
    ([], None, "batch_sizes .--batch-size. must be whole numbers"),
    ([1, 0], None, "batch_sizes .--batch-size. must be whole numbers"),
    ([2.0], None, "eval.batch_sizes.0.: expected int, got float"),
    ([1], 0, "plain_above .--plain-above. must be a whole number >= 1"),
    ([1], "always", "plain_above.*fits none of"),
])
def test_bad_batch_settings_are_refused(sizes, plain_above, message):
    with pytest.raises(DraftheadsError, match=message):
        build(EvalConfig, {"batch_sizes": sizes, "plain_above": plain_above}, "eval")


def test_plain_above_auto_measures_each_drafter_again_switching_where_its_prediction_says(eagle_run, tmp_path):
    """Every drafter is measured twice: speculating always, and as '<name>@auto' decoding plainly above the rows its
    prediction pays for (from the batch profile); both exact, both predicted at every batch size."""
    folder, prompts = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts=str(prompts), tree="chain:2", max_new_tokens=6,
                                             batch_sizes=[1, 2], plain_above="auto"),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    names = [d["name"] for d in report["drafters"]]
    assert names == ["prompt-lookup", "eagle-tiny", "prompt-lookup@auto", "eagle-tiny@auto"]
    auto = {d["name"]: d["plain_above"] for d in report["drafters"] if d["name"].endswith("@auto")}
    assert all(0 <= rows <= 2 for rows in auto.values())
    rows = report["results"]
    assert all(r["greedy_mismatches"] == 0 for r in rows)
    assert all(r["predicted_speedup"] > 0 for r in rows if not r["drafter"].endswith("@auto"))
    for row in rows:   # above its threshold the @auto drafter decodes plainly: one node a step
        if row["drafter"].endswith("@auto") and row["batch_size"] > auto[row["drafter"]]:
            assert row["tau"] == 1.0 and row["mean_nodes"] == 1.0
