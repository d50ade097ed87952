"""llama.cpp, built from the llama-cpp-python source on PyPI, runs our EAGLE-3 drafters.

A small EAGLE-3 drafter is trained for a few dozen steps on answers the embedded target (SmolLM2-135M) wrote, then
exported to GGUF; llama-server decodes the same prompts with it and without it. Greedy speculative output must equal
llama.cpp's plain greedy output, and the engine must accept drafts: on the prompts the drafter was trained on it has
learned the answers, so llama.cpp's tokens per target pass must come close to our own loop's tau. The file we write is
also compared with what llama.cpp's own converter makes of our vLLM-layout export. `make test` builds llama.cpp first
(cached); here `install_llama_cpp` only finds it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.engines.small_runs import PROMPTS, train_small, write_prompts

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target, tokenizer, the prompts file, an EAGLE-3 run trained on the target's answers to those prompts)."""
    from draftheads import load_target

    where = tmp_path_factory.mktemp("llama-cpp-engine")
    prompts = write_prompts(where)
    target = load_target("smollm2-135m", dtype="fp32", device="cpu")
    return target, prompts, train_small("eagle3-smollm2", where, "run", target, ["head.ttt_steps=2"])


def test_llama_cpp_runs_our_eagle3_drafter_losslessly_and_accepts_its_drafts(engine, trained, tmp_path):
    from draftheads.evaluation.engine_eval import run_engine_eval
    from draftheads.evaluation.eval_config import EngineEvalConfig

    target, prompts, run = trained
    config = EngineEvalConfig(prompts=str(prompts), max_new_tokens=64, draft_tokens=[3], ngram=False)
    folder = run_engine_eval([str(run)], config, out=str(tmp_path / "eval"), target_model=target)
    report = json.loads((folder / "report.json").read_text())
    rows = {r["kind"]: r for r in report["results"]}
    plain, drafter = rows["plain"], rows["drafter"]
    assert plain["new_tokens"] > 0 and drafter["new_tokens"] == plain["new_tokens"]
    assert drafter["greedy_mismatches"] == 0                    # speculative greedy == llama.cpp's plain greedy
    assert drafter["drafted"] > 0 and drafter["accepted"] > 0   # llama.cpp drafted with our file and kept drafts
    # trained on these answers, the drafter predicts them in both: the engine reads the file as we meant it
    assert drafter["our_tau"] > 1.5 and drafter["tokens_per_pass"] > 1.5
    assert abs(drafter["tau_gap"]) < 0.35
    assert (folder / "report.md").is_file() and (folder / "engine_speedup.png").is_file()


def test_our_gguf_is_what_llama_cpps_converter_makes_of_our_vllm_export(engine, trained, tmp_path):
    """The converter (vendored beside the build) on our vLLM folder and the embedded target's Hugging Face folder
    gives the same tensors, bit for bit, and the same metadata: the fields it writes that we do not are its own
    labels, and tokenizer.ggml.add_space_prefix is the target GGUF's own field, which we copy. Both read the base model,
    licence and tags from a model card (the converter the vLLM folder's README.md, ours the card's front matter)."""
    import subprocess
    import sys

    from gguf import GGUFReader

    from draftheads.core.targets import embedded_checkpoint
    from draftheads.interop.export import export_drafter

    _, _, run = trained
    ours = export_drafter(run, "llama.cpp", tmp_path / "ours") / "drafter.gguf"
    vllm = export_drafter(run, "vllm", tmp_path / "vllm", dtype="fp16")
    converted = tmp_path / "converted.gguf"
    env = {**os.environ, "PYTHONPATH": str(engine.folder / "source" / "gguf-py")}
    done = subprocess.run([sys.executable, str(engine.converter), str(vllm), "--target-model-dir",
                           str(embedded_checkpoint("smollm2-135m")), "--outtype", "f16", "--outfile", str(converted)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    a, b = GGUFReader(str(ours)), GGUFReader(str(converted))
    fields_a = {k: f for k, f in a.fields.items() if not k.startswith("GGUF.")}
    fields_b = {k: f for k, f in b.fields.items() if not k.startswith("GGUF.")}
    assert set(fields_a) - set(fields_b) <= {"tokenizer.ggml.add_space_prefix"}
    assert set(fields_b) - set(fields_a) <= {"general.quantization_version", "general.size_label", "general.type"}
    for key in set(fields_a) & set(fields_b) - {"general.name", "general.tags"}:
        assert fields_a[key].contents() == fields_b[key].contents(), key
    # the converter read the vLLM folder's model card; ours is the llama.cpp card, whose tags add gguf
    assert fields_a["general.tags"].contents() == fields_b["general.tags"].contents() + ["gguf"]
    tensors_b = {t.name: t for t in b.tensors}
    assert {t.name for t in a.tensors} == set(tensors_b)
    for t in a.tensors:
        other = tensors_b[t.name]
        assert t.tensor_type == other.tensor_type and list(t.shape) == list(other.shape), t.name
        assert np.array_equal(np.asarray(t.data), np.asarray(other.data)), t.name


def test_the_retrain_rule_fires_on_an_updated_target_in_llama_server_and_not_on_the_original(engine, trained,
                                                                                              tmp_path):
    """The drafter served by llama-server on its own target sets the baseline and, served again, stays within it; on
    the target's GGUF requantized (Q4_1 -> Q4_0: 18% of its top-1 tokens change, docs/drift.md) the acceptance
    llama-server's /metrics counts falls and the rule fires. A fine-tuned update, converted with the vendored
    converter, is served too (fine-tuned on the drafter's own rows, it sharpens rather than shifts: no assertion on
    the rule there)."""
    from transformers import AutoTokenizer

    from draftheads.core.targets import embedded_checkpoint, embedded_gguf
    from draftheads.data.chat import first_messages, render_ids
    from draftheads.drift.acceptance_monitor import RetrainRule, serve_monitored
    from draftheads.drift.target_update import UpdateConfig, update_target
    from draftheads.interop.export import export_drafter
    from draftheads.interop.gguf_targets import convert_to_gguf, requantize_gguf

    _, _, run = trained
    drafter = export_drafter(run, "llama.cpp", tmp_path / "drafter") / "drafter.gguf"
    original = embedded_gguf("smollm2-135m")
    requantized = requantize_gguf(original, tmp_path / "q4_0.gguf", "q4_0")
    updated = update_target(run.parent / "data", tmp_path / "updated",
                            UpdateConfig(method="full", steps=2, lr=1e-5, batch_size=4, max_length=192))
    updated_gguf = convert_to_gguf(updated, tmp_path / "updated.gguf", "f16")
    tokenizer = AutoTokenizer.from_pretrained(embedded_checkpoint("smollm2-135m"))
    ids = [render_ids(tokenizer, first_messages([p], None), add_generation_prompt=True) for p in PROMPTS] * 2

    def served(gguf, rule, name):
        return serve_monitored(engine.server, gguf, drafter, ids, rule, tmp_path / f"{name}.log")

    _, baseline = served(original, RetrainRule(baseline=0.5), "baseline")
    assert baseline > 0.3                      # trained on these answers, the drafter is accepted
    rule = RetrainRule(baseline=baseline, tolerance=0.15, window=8, min_observations=4)
    same, same_rate = served(original, rule, "original")
    moved, moved_rate = served(requantized, rule, "requantized")
    assert same.fired_at is None and abs(same_rate - baseline) < 0.05
    assert moved_rate < rule.threshold and moved.fired_at is not None
    _, updated_rate = served(updated_gguf, rule, "updated")
    assert updated_rate > 0                    # the converted update loads and drafts are accepted
