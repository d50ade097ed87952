"""llama.cpp runs our DSpark and DFlash drafters (`draft-dspark`, `draft-dflash`), converted by its own converter.

Small DSpark and DFlash drafters are trained for a few dozen steps on answers the embedded target (SmolLM2-135M)
wrote, exported (interop/llama_cpp_block.py: our speculators folder through convert_hf_to_gguf.py with the target's
tokenizer), and run by llama-server beside its plain decoding on the same prompts: greedy speculative output must equal
llama.cpp's plain greedy output, llama.cpp must accept drafts, and its tokens per target pass must come close to our
own loop's tau on the same prompts (the engine reads the slots, the Markov head and the layer ids as we meant them).
"""

from __future__ import annotations

import json

import pytest

from tests.engines.small_runs import train_small, write_prompts

pytestmark = pytest.mark.slow

HEADS = {  # small blocks of the recipes' drafters, so 60 steps on four answers learn them
    "dspark": ["head.block_size=4", "head.markov_rank=32", "head.num_layers=1"],
    "dflash": ["head.block_size=5", "head.num_layers=1"],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target, the prompts file, {kind: a run trained on the target's answers to those prompts})."""
    from draftheads import load_target

    where = tmp_path_factory.mktemp("llama-cpp-block")
    prompts = write_prompts(where)
    target = load_target("smollm2-135m", dtype="fp32", device="cpu")
    return target, prompts, {kind: train_small(f"{kind}-smollm2", where, kind, target, head)
                             for kind, head in HEADS.items()}


def test_llama_cpp_runs_our_block_drafters_losslessly_and_as_our_loop_does(engine, trained, tmp_path):
    from draftheads.evaluation.engine_eval import run_engine_eval
    from draftheads.evaluation.eval_config import EngineEvalConfig

    target, prompts, runs = trained
    config = EngineEvalConfig(prompts=str(prompts), max_new_tokens=64, draft_tokens=[3], ngram=False)
    folder = run_engine_eval([str(runs["dspark"]), str(runs["dflash"])], config, out=str(tmp_path / "eval"),
                             target_model=target)
    report = json.loads((folder / "report.json").read_text())
    plain = next(r for r in report["results"] if r["kind"] == "plain")
    drafters = [r for r in report["results"] if r["kind"] == "drafter"]
    assert [c["args"][-1] for c in report["configs"] if c["kind"] == "drafter"] == ["draft-dspark", "draft-dflash"]
    for row in drafters:
        assert row["new_tokens"] == plain["new_tokens"] > 0
        assert row["greedy_mismatches"] == 0                    # speculative greedy == llama.cpp's plain greedy
        assert row["drafted"] > 0 and row["accepted"] > 0       # llama.cpp drafted with our file and kept drafts
        # trained on these answers, the drafter predicts them in both loops: measured (native AVX512-BF16, fp32)
        # DSpark 1.50 ours / 1.43 in llama.cpp, DFlash 1.74 / 1.64; the bounds leave 0.18 below the lowest
        assert row["our_tau"] > 1.25 and row["tokens_per_pass"] > 1.25, row
        # the engine's tokens per pass against our tau: measured -4.7% and -6.0% (the drafter's near ties fall apart
        # under llama.cpp's kernels and ours); 15% leaves room without hiding a layout mismatch (tau ~1.0 there)
        assert abs(row["tau_gap"]) < 0.15, row
