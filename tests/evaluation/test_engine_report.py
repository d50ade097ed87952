"""The in-engine evaluation's numbers, from the engine's replies, by hand: tokens/s over the engine's own time, tokens
per target pass (the first token comes from the prompt's forward), speedup against plain, greedy mismatches; and the
configurations it starts."""

from __future__ import annotations

import pytest

from draftheads.evaluation.engine_eval import EngineConfig, Side, engine_configs
from draftheads.evaluation.engine_report import engine_rows, format_engine_table
from draftheads.interop.llama_server import Reply


def side(*replies: tuple) -> Side:
    """replies: (tokens, engine seconds[, drafted, accepted])."""
    out = Side()
    for tokens, seconds, drafted, accepted in (r + (0, 0) if len(r) == 2 else r for r in replies):
        out.tokens += tokens
        out.replies.append(Reply(tokens, prompt_s=0.1, decode_s=seconds - 0.1, prompt_tokens=20, drafted=drafted,
                                 accepted=accepted))
    return out


def test_rows_from_the_engines_replies():
    configs = [EngineConfig("plain", "plain"), EngineConfig("d n=3", "drafter", drafter="d", draft_tokens=3)]
    sides = {"plain": [side(([1, 2, 3, 4, 5, 6, 7, 8, 9], 1.0)), side(([4, 5, 6, 7, 8], 0.5))],
             "d n=3": [side(([1, 2, 3, 4, 5, 6, 7, 8, 9], 0.5, 9, 5)), side(([4, 5, 6, 7, 9], 0.25, 3, 2))]}
    rows = engine_rows(configs, sides, {("d", 3): {"tau": 2.2, "acceptance_rates": [0.6]}})
    plain, spec = rows
    assert plain["tokens_per_s"] == pytest.approx(14 / 1.5) and plain["tokens_per_pass"] == pytest.approx(1.0)
    assert spec["tokens_per_s"] == pytest.approx(14 / 0.75) and spec["speedup"] == pytest.approx(2.0)
    # 8 + 4 tokens after the prompts' forwards, in (8 - 5) + (4 - 2) passes
    assert spec["target_passes"] == 5 and spec["tokens_per_pass"] == pytest.approx(12 / 5)
    assert spec["acceptance"] == pytest.approx(7 / 12) and spec["our_tau"] == 2.2
    assert spec["tau_gap"] == pytest.approx((12 / 5) / 2.2 - 1)
    assert spec["greedy_mismatches"] == 1 and spec["mismatched_prompts"] == [1] and spec["first_divergence"] == [4]
    table = format_engine_table(rows)
    assert "| d n=3 | 3 | 18.7 | 2.00x | 12 | 7 | 58% | 2.40 | 2.20 | +9% | 1/2 |" in table


def test_configs_plain_first_then_ngram_modes_then_each_drafter_length():
    configs = engine_configs({"d": "d.gguf"}, [2, 3], ngram=True, p_mins=[0.0, 0.5])
    assert configs[0].kind == "plain" and configs[0].args == ()
    ngram = [c for c in configs if c.kind == "ngram"]
    assert {c.args[1] for c in ngram} == {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}
    drafters = [c for c in configs if c.kind == "drafter"]
    assert [(c.draft_tokens, c.p_min) for c in drafters] == [(2, 0.0), (2, 0.5), (3, 0.0), (3, 0.5)]
    for c in drafters:
        args = list(c.args)
        assert args[args.index("--spec-type") + 1] == "draft-eagle3" and args[args.index("-md") + 1] == "d.gguf"
        assert args[args.index("--spec-draft-n-max") + 1] == str(c.draft_tokens)
    assert len([c for c in configs if c.kind == "drafter+ngram"]) == 4
    assert [c.kind for c in engine_configs({"d": "d.gguf"}, [2], ngram=False)] == ["plain", "drafter"]
