"""Evaluation: formulas against hand computations, the interleaved measurement against hand counts and
plain decoding (a wrong loop must show greedy mismatches), the report files against each other."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json

import pytest
import torch

import draftheads.decoding.decoder as decoder_module  # the loop that calls the rule
import draftheads.decoding.generate as generate_module
import draftheads.measurement.measure as measure_module
from draftheads.core.config import build
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import AutoTreeSpec, Tree
from draftheads.decoding.accept import Acceptance
from draftheads.decoding.combined import CombinedDrafter, graft
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.settings import DecodeSettings
from draftheads.decoding.stats import GenerationStats
from draftheads.decoding.tree_tensors import retrieve_indices
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.evaluation.report import TABLE_COLUMNS
from draftheads.evaluation.results import build_rows
from draftheads.evaluation.summary import chain_speedup, estimate_alpha, summarise
from draftheads.measurement.conversations import Conversation, EvalSettings
from draftheads.measurement.entries import Entry
from draftheads.measurement.measure import RunConfig, generate_conversations, measure, plan_configs, reply_logprob
from tests.decoding.stubs import OracleDrafter, RandomDrafter
from tests.fixtures import make_target, make_tokenizer
from tests.margins import at_least

PROMPTS = ["Write a function that returns the sum of a list of numbers.", "for i in range(10):\n    print(i * i)\n"]


@functools.cache
def fixture():
    tokenizer = make_tokenizer("chatml")
    return make_target("llama", tokenizer), tokenizer


def settings(max_new_tokens: int = 9, stop_ids=(), seed: int = 0, **kw) -> EvalSettings:
    decode = DecodeSettings(max_new_tokens=max_new_tokens, eos_token_id=stop_ids, **kw)
    return EvalSettings(decode, max_length=400, seed=seed)


def conversations(n: int = 2) -> list[Conversation]:
    return [Conversation(i, [PROMPTS[i % len(PROMPTS)]], None) for i in range(n)]


# ---------------------------------------------------------------- formulas


@pytest.mark.parametrize("alpha,k,c,expected", [
    (0.8, 4, 0.1, (1 - 0.8 ** 5) / (0.2 * 1.4)),   # 2.40114...
    (0.5, 2, 0.0, 1.75),                            # 1 + 0.5 + 0.25, free drafts
    (0.0, 3, 0.2, 1 / 1.6),                         # nothing accepted: pure overhead
    (1.0, 3, 0.1, 4 / 1.3),                         # everything accepted: K + 1 tokens per (K c + 1)
])
def test_chain_speedup_matches_hand_computation(alpha, k, c, expected):
    assert chain_speedup(alpha, k, c) == pytest.approx(expected, rel=1e-12)
    assert chain_speedup(0.8, 4, 0.1) == pytest.approx(2.401142857, rel=1e-9)


def hand_stats() -> tuple[GenerationStats, GenerationStats]:
    """Plain: 9 steps of 40 ms. Spec (chain 3): accepted 2, 0 (no draft), 3 drafts; 12 ms drafting, 64 ms verifying."""
    chain = Tree.chain(3)
    plain = GenerationStats(prompts=1, new_tokens=10, total_s=0.4)
    for _ in range(9):
        plain.record_step(Tree.from_paths([]), [0], 1, draft_s=0.0, verify_s=0.04)
    spec = GenerationStats(prompts=1, new_tokens=9, total_s=0.25)
    spec.record_step(chain, [0, 1, 2], 3, draft_s=0.012, verify_s=0.064)
    spec.record_step(Tree.from_paths([]), [0], 1, draft_s=0.012, verify_s=0.064)   # lookup found nothing
    spec.record_step(chain, [0, 1, 2, 3], 4, draft_s=0.012, verify_s=0.064)
    return plain, spec


def test_summary_matches_hand_count():
    plain, spec = hand_stats()
    row = summarise(plain, spec, depth=3)
    assert row["tau"] == pytest.approx(8 / 3)                    # 3 + 1 + 4 tokens over 3 forwards, bonus included
    # per depth, given a draft to check there: the empty step has none; depth 3 reached twice, accepted once
    assert row["acceptance_rates"] == pytest.approx([1.0, 1.0, 0.5])
    assert row["alpha"] == pytest.approx(5 / 7)                  # 5 accepted, 2 steps stopped short of K = 3
    assert row["c"] == pytest.approx(0.012 / (3 * 0.04))         # 0.1 per draft level
    assert row["draft_cost"] == pytest.approx(0.3) and row["verify_cost"] == pytest.approx(1.6)
    assert (row["forwards_plain"], row["forwards_spec"]) == (10, 4) and row["forwards_saved"] == pytest.approx(0.6)
    assert row["speedup"] == pytest.approx((9 / 0.25) / (10 / 0.4))
    assert row["chain_speedup"] == pytest.approx(chain_speedup(5 / 7, 3, 0.1))
    assert row["accepted_hist"] == [1, 0, 1, 1]


def test_tau_by_context_counts_the_steps_of_each_range():
    stats = GenerationStats()
    for emitted, context in ((3, 10), (1, 300), (2, 300), (4, 600), (1, 2500)):
        stats.record_step(Tree.chain(3), list(range(emitted)), emitted, 0.0, 0.0, context=context)
    assert stats.tau_by_context() == [{"context": "0-256", "steps": 1, "tau": 3.0},
                                      {"context": "256-512", "steps": 2, "tau": 1.5},
                                      {"context": "512-1024", "steps": 1, "tau": 4.0},
                                      {"context": "2048+", "steps": 1, "tau": 1.0}]


def test_the_loop_records_each_steps_context(llama_target):
    """A step's context is the prompt plus what was committed before it: it grows by what each step emitted."""
    from draftheads.decoding.generate import speculative_generate
    from draftheads.decoding.lookup import PromptLookupDrafter

    prompt = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    stats = speculative_generate(llama_target, PromptLookupDrafter(), prompt, max_new_tokens=12).stats
    assert stats.step_context[0] == prompt.shape[1] + 1   # the prefill committed the first token
    for before, emitted, after in zip(stats.step_context, stats.step_emitted, stats.step_context[1:]):
        assert after == before + emitted


def test_alpha_counts_empty_drafts_as_stops():
    stats = GenerationStats()
    for path in ([0], [0], [0, 1], [0, 1, 2]):
        stats.record_step(Tree.chain(2), path, len(path), 0.0, 0.0)
    assert estimate_alpha(stats, depth=2) == pytest.approx(3 / (3 + 3))   # the full-length step is no stop


def test_plan_configs_runs_greedy_once():
    configs = plan_configs(["greedy", "strict", "typical"], [0.0, 0.7])
    assert configs == [RunConfig("greedy", 0.0), RunConfig("strict", 0.0), RunConfig("strict", 0.7),
                       RunConfig("typical", 0.0), RunConfig("typical", 0.7)]
    assert [c.plain_key for c in configs] == [0.0, 0.0, 0.7, 0.0, 0.7]


# ---------------------------------------------------------------- combined drafter


def test_graft_shares_prefix_then_branches():
    tree = Tree.from_paths([(0,), (1,), (0, 0)])            # root r; a=(0,), b=(1,), c=(0,0)
    merged, tokens = graft(tree, [9, 10, 11, 12], [10, 13, 14])
    by_path = {p: tokens[i + 1] for i, p in enumerate(merged.paths)}
    assert by_path == {(0,): 10, (1,): 11, (0, 0): 12, (0, 1): 13, (0, 1, 0): 14}
    merged, tokens = graft(tree, [9, 10, 11, 12], [15])      # a new root branch takes the next free rank
    assert dict(zip(merged.paths, tokens[1:]))[(2,)] == 15 and merged.num_nodes == 5


def test_combined_drafter_adds_the_lookup_continuation():
    drafter = CombinedDrafter(RandomDrafter(50, tree=Tree.chain(2)), lookup_depth=4)
    drafter.reset()
    history = torch.tensor([[1, 2, 3, 9, 7, 1, 2]])
    drafter.observe(torch.zeros(1, 7, 0), history)
    proposal = drafter.propose(Tree.chain(2))
    tokens = proposal.tokens[0].tolist()
    paths = {tuple(tokens[n] for n in proposal.tree.ancestors(node)[1:]) for node in range(proposal.tree.num_nodes)}
    assert (3, 9, 7, 1) in paths                           # what followed the earlier "1 2"
    assert proposal.q is None and tokens[0] == 2


def test_switch_verifies_the_lookup_chain_alone_while_text_is_copied():
    learned = RandomDrafter(50, tree=Tree.chain(2))
    drafter = CombinedDrafter(learned, lookup_depth=4, switch=True, copy_after=2)
    drafter.reset()
    drafter.observe(torch.zeros(1, 7, 0), torch.tensor([[1, 2, 3, 9, 7, 1, 2]]))
    first = drafter.propose(Tree.chain(2))          # nothing copied yet: the learned tree with lookup grafted on
    assert first.tree.num_nodes == 1 + 2 + 4
    drafter.observe(torch.zeros(1, 3, 0), torch.tensor([[3, 9, 7]]))   # three of the chain 3 9 7 1 committed
    calls = []
    learned.propose = lambda *a, **k: calls.append(1)                   # must not be asked to draft
    copying = drafter.propose(Tree.chain(2))
    # lookup as it drafts alone (up to its chain of 6, not the 4 grafted): all that followed the earlier "3 9 7"
    assert copying.tree.paths == Tree.chain(5).paths and calls == []
    assert copying.tokens[0].tolist() == [7, 1, 2, 3, 9, 7]
    assert drafter.last_paths == [[1, 2, 3, 9, 7]]
    del learned.propose
    drafter.observe(torch.zeros(1, 2, 0), torch.tensor([[6, 1]]))       # the chain 1 2 3 9 missed at its first token
    again = drafter.propose(Tree.chain(2))                              # lookup still finds "2 3 9 7" after "1"
    assert again.tree.num_nodes == 1 + 2 + 4 and again.tokens[0].tolist()[0] == 1


@pytest.mark.trains
def test_switch_keeps_greedy_output_and_drafts_lookup_alone_in_a_loop():
    """The tiny Qwen2's greedy text falls into loops: the switch verifies the lookup chain alone there, the
    output stays plain decoding's, and tau is the grafted combination's."""
    from tests.decoding.test_batch import PROMPTS, target
    model = target("qwen2")
    plain = speculative_generate(model, None, PROMPTS[2], 60, eos_token_id=[])
    alone = []
    for switch in (False, True):
        drafter = CombinedDrafter(RandomDrafter(model.config.vocab_size, tree=Tree.chain(3)), switch=switch)
        propose = drafter.propose
        def counted(*args, **kw):
            proposal = propose(*args, **kw)
            alone.append(switch and bool(drafter.last_paths)
                         and proposal.tree.num_nodes == 1 + len(drafter.last_paths[0]))
            return proposal
        drafter.propose = counted
        out = speculative_generate(model, drafter, PROMPTS[2], 60, tree="chain:3", eos_token_id=[])
        assert out.rows == plain.rows
        # 2.27 under every kernel setting tried (native AMX, avx2, default, one thread, oneDNN AVX2): the loop's
        # text is the same greedy text on each
        at_least(out.stats.tau, 2.0, f"tau, switch={switch}")
    assert sum(alone) >= 3


def test_combination_modes_and_their_spec_suffixes():
    from draftheads.measurement.drafter_specs import split_spec

    assert (split_spec("runs/x+lookup-switch") == ("runs/x", "lookup", "switch")
            and split_spec("runs/x+lookup") == ("runs/x", "lookup", "graft"))
    assert split_spec("runs/x+lookup-gate") == ("runs/x", "lookup", "gate")
    assert split_spec("runs/x+suffix") == ("runs/x", "suffix", "graft")
    assert split_spec("runs/x+suffix-gate") == ("runs/x", "suffix", "gate") and split_spec("x") == ("x", None, None)
    assert EvalConfig(combined="graft").combined_modes == ["graft"]
    assert EvalConfig(combined="all").combined_modes == ["graft", "switch", "gate"]
    assert EvalConfig().combined_modes == [] and EvalConfig(combined="gate").combined_modes == ["gate"]
    with pytest.raises(DraftheadsError, match="eval.combined: 'both' is not one of"):
        build(EvalConfig, {"combined": "both"}, "eval")


# ---------------------------------------------------------------- measurement


def run_rows(entries, configs, conv, sett):
    model, tokenizer = fixture()
    found = measure(model, tokenizer, conv, entries, configs, sett, progress=False)[1]
    return build_rows(found, entries, configs, conv), found


def random_entry(model, seed=3) -> Entry:
    return Entry("random", "learned", RandomDrafter(model.config.vocab_size, seed=seed, tree=Tree.chain(3)), None, 3,
                 {"tree": "chain:3"})


def test_greedy_mismatches_zero_for_correct_loop_and_counted_for_a_wrong_one(monkeypatch):
    model, _ = fixture()
    conv = conversations(2)
    rows, _ = run_rows([random_entry(model)], [RunConfig("greedy", 0.0)], conv, settings())
    assert rows[0]["greedy_mismatches"] == 0 and rows[0]["mismatched_prompts"] == []

    real = decoder_module.accept

    def accept_first_leaf(rule, tree, tokens, p, q=None, generator=None, **kw):
        """A broken rule: takes the first root-to-leaf path whatever the target says."""
        real(rule, tree, tokens, p, q, generator, **kw)
        path = retrieve_indices(tree)[:1]
        n = int((path >= 0).sum()) - 1
        return Acceptance(path, torch.tensor([n]), p[:, path[0, n]].argmax(-1))

    monkeypatch.setattr(decoder_module, "accept", accept_first_leaf)
    rows, _ = run_rows([random_entry(model)], [RunConfig("greedy", 0.0)], conv, settings())
    assert rows[0]["greedy_mismatches"] == 2 and rows[0]["mismatched_prompts"] == [0, 1]
    assert all(0 < i < 9 for i in rows[0]["first_divergence"])   # token 0 comes from the prefill, untouched


def test_oracle_numbers_equal_hand_count():
    """An oracle chain of 3 accepts everything: 9 new tokens = 1 from the prefill + 2 steps of 4."""
    model, tokenizer = fixture()
    first = tokenizer("<|im_start|>")["input_ids"][0]
    entry = Entry("oracle", "learned", OracleDrafter(model, first, tree=Tree.chain(3)), None, 3, {"tree": "chain:3"})
    rows, found = run_rows([entry], [RunConfig("greedy", 0.0)], conversations(2), settings(9))
    row = rows[0]
    assert row["tau"] == 4.0 and row["steps"] == 4 and row["new_tokens"] == 18
    assert row["alpha"] == 1.0 and row["acceptance_rates"] == [1.0, 1.0, 1.0] and row["accepted_hist"] == [0, 0, 0, 4]
    assert (row["forwards_plain"], row["forwards_spec"]) == (18, 6) and row["forwards_saved"] == pytest.approx(2 / 3)
    assert row["greedy_mismatches"] == 0
    assert [len(o.tokens) for o in found.plain[0.0]] == [9, 9]


def test_sampled_rows_report_logprob_and_no_mismatch_count():
    model, _ = fixture()
    rows, found = run_rows([random_entry(model)], [RunConfig("typical", 1.0)], conversations(1), settings(6))
    row = rows[0]
    assert row["greedy_mismatches"] is None
    assert row["logprob_spec"] < 0 and row["logprob_plain"] < 0
    plain = found.plain[1.0][0]
    assert row["logprob_plain"] == pytest.approx(plain.logprob_sum / plain.logprob_count) and plain.logprob_count == 6


def test_reply_logprob_equals_stepwise_sum():
    model, _ = fixture()
    context, reply = [5, 17, 42, 8], [3, 99, 12]
    expected = 0.0
    with torch.no_grad():
        for j, token in enumerate(reply):
            logits = model(input_ids=torch.tensor([context + reply[:j]])).logits[0, -1]
            expected += float(logits.log_softmax(-1)[token])
    total, count = reply_logprob(model, context, reply)
    assert count == 3 and total == pytest.approx(expected, abs=1e-4)


def test_turns_are_answered_one_by_one_with_the_chat_template(monkeypatch):
    """Each turn is one generation on the conversation so far: user 1, reply 1, user 2 (rendered as in training)."""
    model, tokenizer = fixture()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    real, inputs = generate_module.generate, []

    def short_replies(target, drafter, ids, settings, **kw):
        inputs.append(ids[0].tolist())
        out = real(target, drafter, ids, dataclasses.replace(settings, max_new_tokens=3, eos_token_id=[]), **kw)
        out.rows = [row + [end] for row in out.rows]   # every reply ends its turn
        return out

    monkeypatch.setattr(measure_module, "generate", short_replies)
    conv = [Conversation(0, ["Hello! How can I help you today?", "Write a class Stack."], None)]
    rows, found = run_rows([random_entry(model)], [RunConfig("greedy", 0.0)], conv, settings(stop_ids=[end]))
    plain = found.plain[0.0][0]
    assert plain.stats.prompts == 2 and len(plain.tokens) == 8 and rows[0]["greedy_mismatches"] == 0
    first, first_reply = inputs[0], plain.tokens[:4]
    seconds = [ids for ids in inputs if len(ids) > len(first)]
    assert len(seconds) == 2                                 # plain and speculative (the warm-up answers turn 1 only)
    for ids in seconds:
        assert ids[: len(first) + 4] == first + first_reply
        assert "Write a class Stack." in tokenizer.decode(ids[len(first) + 4:])


# ---------------------------------------------------------------- run_eval end to end


@pytest.fixture(scope="module")
def eagle_run(tmp_path_factory):
    from draftheads.api import build_drafter
    from draftheads.interop.native import save_drafter

    model, _ = fixture()
    folder = tmp_path_factory.mktemp("runs") / "eagle-tiny"
    torch.manual_seed(0)
    save_drafter(build_drafter("eagle", model), folder / "final" / "drafter", model)
    prompts = folder.parent / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return folder, prompts


def md_table(text: str) -> list[list[str]]:
    """The first Markdown table's header and rows."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [line for line in lines[start:end] if not line.startswith("|---")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in rows]


def test_run_eval_writes_consistent_report(eagle_run, tmp_path, capsys):
    folder, prompts = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts=str(prompts), accept=["greedy", "strict"], temperatures=[1.0],
                                             tree="chain:2", max_new_tokens=6, combined="graft"),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    for key in ("created", "settings", "target", "environment", "drafters", "results", "plain", "plots",
                "prompt_count"):
        assert key in report
    assert report["environment"]["versions"]["torch"] == importlib.metadata.version("torch")
    assert report["target"]["dtype"] == "fp32" and report["settings"]["seed"] == 0 and report["prompt_count"] == 2
    names = [d["name"] for d in report["drafters"]]
    assert names == ["prompt-lookup", "eagle-tiny", "eagle-tiny+lookup"]
    rows = report["results"]
    assert [(r["rule"], r["temperature"]) for r in rows] == [("greedy", 0.0)] * 3 + [("strict", 1.0)] * 3
    assert all(r["greedy_mismatches"] == 0 for r in rows[:3])            # fp32: speculative == plain, always
    assert all(r["logprob_spec"] is not None and r["greedy_mismatches"] is None for r in rows[3:])
    md = (out / "report.md").read_text()
    table = md_table(md)
    columns = [c for c in TABLE_COLUMNS if c != "B"]           # batch size 1 only: no batch-size column
    assert table[0] == columns and len(table) == 1 + len(rows)
    for cells, row in zip(table[1:], rows):
        cell = dict(zip(columns, cells))
        assert (cell["drafter"], cell["rule"]) == (row["drafter"], row["rule"])
        assert cell["tau"] == f"{row['tau']:.2f}" and cell["speedup"] == f"{row['speedup']:.2f}x"
        assert (cell["predicted"] == f"{row['predicted_speedup']:.2f}x"
                and cell["chain"] == f"{row['chain_speedup']:.2f}x")
        assert cell["error"] == f"{100 * (row['predicted_speedup'] / row['speedup'] - 1):+.0f}%"
    assert "INCLUDING the bonus token" in md
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| prompt-lookup | greedy |" in capsys.readouterr().out


def test_run_eval_predicts_every_row_before_running_it_and_fits_trees_for_speed(eagle_run, tmp_path, monkeypatch):
    """Predictions come from the profile and calibration runs made before the measured ones (calibration: the
    prompts after --limit, or the first ones when there are no more); `auto` fits a tree for speed, and a gated
    combination is priced for it."""
    folder, prompts = eagle_run
    order = []
    real = measure_module.generate_conversations
    monkeypatch.setattr(measure_module, "generate_conversations", lambda m, t, convs, *a, **kw:
                        order.append([c.prompt_id for c in convs]) or real(m, t, convs, *a, **kw))
    import draftheads.costmodel.calibration as calibration_module

    # the calibration runs, made where they are fitted (costmodel/calibration.Calibration.runs)
    monkeypatch.setattr(calibration_module, "generate_conversations", measure_module.generate_conversations)
    config = EvalConfig(prompts=str(prompts), limit=1, tree="auto:6", max_new_tokens=6)
    out = run_eval([str(folder), f"{folder}+lookup-gate"], config, target_model=fixture(), out=str(tmp_path / "eval"),
                   progress=False)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["calibration_prompts"] == [1]          # the prompt after the evaluated one
    for row in report["results"]:
        assert row["predicted_speedup"] > 0 and row["prediction_error"] == pytest.approx(
            row["predicted_speedup"] / row["speedup"] - 1)
        low, high = row["predicted_range"]
        assert low <= row["predicted_speedup"] <= high and row["in_predicted_range"] == (low <= row["speedup"] <= high)
    learned = next(d for d in report["drafters"] if d["kind"] == "learned")
    assert learned["auto_tree"].startswith("auto:6 -> ") and "predicted" in learned["auto_tree"]
    assert len(learned["tree_paths"]) <= 6
    gated = next(d for d in report["drafters"] if d["name"].endswith("+lookup-gate"))   # priced for that tree
    assert "without a lookup chain" in gated["gate"] and gated["tree"].startswith(learned["tree"])
    measured = [i for i, ids in enumerate(order) if ids == [0]]
    assert all(ids == [1] for ids in order[: measured[0]])           # everything before the measurements: calibration


def test_suffix_decoding_alone_and_gated_beside_a_learned_drafter(eagle_run, tmp_path):
    """'suffix' and 'FOLDER+suffix-gate' are measured beside the lookup baseline: exact in fp32 greedy, the gate
    priced against suffix decoding alone."""
    folder, prompts = eagle_run
    out = run_eval(["suffix", f"{folder}+suffix-gate"], EvalConfig(prompts=str(prompts), tree="chain:2",
                                                                   max_new_tokens=6),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    assert [d["name"] for d in report["drafters"]] == ["prompt-lookup", "suffix", "eagle-tiny",
                                                       "eagle-tiny+suffix-gate"]
    gated = report["drafters"][-1]
    assert gated["combined_with"] == "suffix" and "suffix tree of up to 16 nodes" in gated["tree"]
    assert "without a lookup chain" in gated["gate"]
    assert all(row["greedy_mismatches"] == 0 for row in report["results"])


def test_each_run_of_suffix_decoding_starts_from_an_empty_output_cache():
    """A prompt answered again drafts its whole earlier answer from the cache, but only within one run: a run
    given no cache starts empty, so no measurement sees outputs of the same prompts from another."""
    from draftheads.measurement.entries import suffix_entry

    model, tokenizer = fixture()
    entry, cfg, conv = suffix_entry(None), RunConfig("greedy", 0.0), conversations(1)
    first, again = (generate_conversations(model, tokenizer, conv, entry, cfg, settings(12))[0] for _ in range(2))
    assert first.stats.step_accepted == again.stats.step_accepted
    shared = entry.output_cache()
    first, again = (generate_conversations(model, tokenizer, conv, entry, cfg, settings(12), outputs=shared)[0]
                    for _ in range(2))
    assert first.tokens == again.tokens and again.stats.steps < first.stats.steps


def test_tau_from_an_earlier_report_feeds_the_prediction_of_matching_rows(eagle_run, tmp_path, capsys):
    """The earlier report's tau and nodes per step (not its timings) replace the calibration prompts' for rows with the
    same drafter, tree, rule and temperature; the other rows keep the calibration prompts' and say so."""
    folder, prompts = eagle_run
    run = dict(target_model=fixture(), progress=False)
    config = EvalConfig(prompts=str(prompts), max_new_tokens=6, tree="chain:2")
    first = run_eval([str(folder)], config, out=str(tmp_path / "first"), **run)
    earlier = json.loads((first / "report.json").read_text())["results"]
    later = dataclasses.replace(config, accept=["greedy", "strict"], temperatures=[1.0], tau_from=str(first))
    second = run_eval([str(folder)], later, out=str(tmp_path / "second"), **run)
    report = json.loads((second / "report.json").read_text())
    assert report["settings"]["tau_from"] == str(first)
    by_key = {(r["drafter"], r["rule"]): r for r in report["results"]}
    for old in earlier:
        row = by_key[(old["drafter"], "greedy")]
        assert row["predicted_from"] == "earlier evaluation" and row["predicted_tau"] == pytest.approx(old["tau"])
    assert all(r["predicted_from"] == "calibration" for r in report["results"] if r["rule"] == "strict")
    assert "has no row with tree" in capsys.readouterr().out
    assert "predicted from an earlier evaluation" in (second / "report.md").read_text()
    with pytest.raises(DraftheadsError, match=r"bad.json is damaged \(lacks .results., .settings.\); give the report"):
        (tmp_path / "bad.json").write_text("{}")
        run_eval([str(folder)], dataclasses.replace(config, tau_from=str(tmp_path / "bad.json")),
                 out=str(tmp_path / "third"), **run)


def test_tasks_prompts_are_broken_down_by_kind_from_the_same_runs(eagle_run, tmp_path):
    folder, _ = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts="tasks", limit=8, tree="chain:2", max_new_tokens=4),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    by_kind = report["by_kind"]
    kinds = {r["task_kind"] for r in by_kind}
    assert len(kinds) >= 5 and "multi-turn" in kinds   # the fixture's 512-token context skips the long passages
    assert sum(r["task_prompts"] for r in by_kind if r["drafter"] == "prompt-lookup") == report["prompt_count"]
    for total in report["results"]:   # the kinds partition the same runs
        parts = [r for r in by_kind if (r["drafter"], r["rule"]) == (total["drafter"], total["rule"])]
        assert sum(r["new_tokens"] for r in parts) == total["new_tokens"]
        prompts = [r for r in report["by_prompt"] if (r["drafter"], r["rule"]) == (total["drafter"], total["rule"])]
        assert len(prompts) == report["prompt_count"]   # and the prompts partition them again
        assert sum(r["new_tokens"] for r in prompts) == total["new_tokens"]
        assert sum(r["steps"] for r in prompts) == total["steps"]
        assert all(r["tau"] == pytest.approx(r["new_tokens"] / r["steps"], abs=0.5) for r in prompts if r["steps"])
    md = (out / "report.md").read_text()
    assert "## By task kind" in md and "| multi-turn |" in md and "tau_per_task_kind.png" in report["plots"]
    assert "## By prompt" in md and "| prompt | task kind | tokens | prompt-lookup | " in md   # drafters as columns
    assert (out / "tau_per_task_kind.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("preset,nodes,depth", [("specbundle-4", 4, 3), ("specbundle-8", 8, 7), ("eagle", 60, 6)])
def test_presets_are_the_fields_token_counts_with_the_verified_token(preset, nodes, depth):
    from draftheads.core.tree import parse_tree

    config = EvalConfig(preset=preset)
    tree = parse_tree(config.tree)
    assert (tree.num_nodes, tree.depth) == (nodes, depth)   # SGLang's num-draft-tokens and EAGLE's total_token
    assert (config.accept, config.temperatures, config.batch_sizes) == (["greedy"], [0.0], [1])
    for clash in ({"tree": "chain:5"}, {"accept": ["strict"]}, {"temperatures": [0.0, 1.0]}, {"batch_sizes": [1, 4]}):
        with pytest.raises(DraftheadsError, match=f"eval.preset {preset} fixes eval."):
            EvalConfig(preset=preset, **clash)


def test_a_preset_run_names_its_preset_in_the_report(eagle_run, tmp_path):
    folder, prompts = eagle_run
    out = run_eval([str(folder)], EvalConfig(prompts=str(prompts), limit=1, preset="specbundle-4", max_new_tokens=4),
                   target_model=fixture(), out=str(tmp_path / "eval"), progress=False)
    report = json.loads((out / "report.json").read_text())
    assert (report["settings"]["preset"], report["settings"]["tree"]) == ("specbundle-4", "chain:3")
    assert {r["tree"] for r in report["results"] if r["drafter"] != "prompt-lookup"} == {"chain:3"}
    assert "preset specbundle-4 (SpecForge's SpecBundle" in (out / "report.md").read_text()


def test_run_eval_rejects_bad_settings(eagle_run, tmp_path):
    from draftheads.api import build_drafter
    from draftheads.interop.native import save_drafter

    folder, prompts = eagle_run
    with pytest.raises(DraftheadsError, match="unknown acceptance rule"):
        run_eval([str(folder)], EvalConfig(prompts=str(prompts), accept=["greedyy"]),
                 target_model=fixture(), out=str(tmp_path))
    for bad in ("chain:x", "auto:0"):
        with pytest.raises(DraftheadsError, match="tree"):
            run_eval([str(folder)], EvalConfig(prompts=str(prompts), tree=bad),
                     target_model=fixture(), out=str(tmp_path))
    with pytest.raises(DraftheadsError, match="calibration_prompts .* >= 1, got 0"):
        EvalConfig(prompts=str(prompts), calibration_prompts=0)
    model, _ = fixture()
    save_drafter(build_drafter("medusa", model), tmp_path / "medusa", model)
    with pytest.raises(DraftheadsError, match="static trees"):
        run_eval([str(tmp_path / "medusa")], EvalConfig(prompts=str(prompts), tree="dynamic:2,2,4"),
                 target_model=fixture(), out=str(tmp_path / "x"), progress=False)
    save_drafter(build_drafter("dflash", model, block_size=4), tmp_path / "dflash", model)
    with pytest.raises(DraftheadsError, match=r"chain:7 is 7 deep, but this dflash drafter drafts at most 3 levels"):
        run_eval([str(tmp_path / "dflash")], EvalConfig(prompts=str(prompts), preset="specbundle-8"),
                 target_model=fixture(), out=str(tmp_path / "y"), progress=False)


def test_auto_tree_fitted_from_measured_accuracies():
    """An oracle's rank-0 draft is always right: the best tree of 4 nodes is the chain of 4. A random drafter
    never matches: the fit falls back to chain:1 and says so."""
    from draftheads.costmodel.calibration import Calibration, fit_auto_trees
    from draftheads.measurement.entries import combined_entry

    model, tokenizer = fixture()
    first = tokenizer("<|im_start|>")["input_ids"][0]
    oracle = Entry("oracle", "learned", OracleDrafter(model, first), None, 0, {"tree": "auto"})
    random = random_entry(model)
    combined = combined_entry(random, "random+lookup")
    fit_auto_trees(Calibration(model, tokenizer, conversations(1), settings(8)), [oracle, random, combined],
                   AutoTreeSpec(4, "tau"))
    assert oracle.tree.paths == Tree.chain(4).paths and oracle.depth == 4
    assert oracle.info["accuracy_table"][0][:2] == [1.0, 0.0]
    assert random.tree.paths == Tree.chain(1).paths and "no draft matched" in random.info["auto_tree"]
    assert combined.tree is random.tree and combined.info["tree"].endswith("+ lookup chain:6")


def test_calibration_takes_as_many_prompts_as_asked_past_the_evaluated_ones(tmp_path):
    from draftheads.measurement.conversations import EvalSettings, load_conversations

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Write function number {i}."}) + "\n" for i in range(8)))
    _, tokenizer = fixture()
    settings = EvalSettings(DecodeSettings(max_new_tokens=8, eos_token_id=[]), max_length=256)
    evaluated, _, calibration = load_conversations(str(prompts), 2, tokenizer, settings, 5)
    assert [c.prompt_id for c in evaluated] == [0, 1] and [c.prompt_id for c in calibration] == [2, 3, 4, 5, 6]
    calibration = load_conversations(str(prompts), 6, tokenizer, settings, 5)[2]
    assert [c.prompt_id for c in calibration] == [6, 7]          # as many as the set has past the evaluated ones
