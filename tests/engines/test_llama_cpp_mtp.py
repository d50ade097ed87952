"""llama.cpp runs a fine-tuned native MTP layer (head.type native) from inside its target's GGUF (`draft-mtp`).

A tiny Qwen3.5 checkpoint with the embedded SmolLM2's tokenizer (llama.cpp's converter knows its pre-tokenizer) ships
a random MTP layer; it is fine-tuned on the target's own answers to the prompts, and `draftheads engine eval` puts it
back into a copy of the checkpoint, converts that with llama.cpp's converter (its Qwen MTP path) and serves it with
`--spec-type draft-mtp`. The engine's output must be its plain greedy output, and its tokens per target pass our own
loop's tau on the same prompts within the issue's 5%. Slow: it needs the llama.cpp build.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that returns the sum of a list of numbers.",
           "Explain in two sentences what a hash table is."]
# Qwen3.5's interleaved MRoPE sections must fit the rotated dimensions (llama.cpp asserts it): 32 x 0.5 = 16 = 2 x 8
ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2],
        "mrope_interleaved": True}
QWEN35 = dict(head_dim=32, rope_parameters=ROPE, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16,
              layer_types=["linear_attention", "full_attention"] * 2 + ["full_attention"])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(target, tokenizer, prompts file, a native drafter fine-tuned on the target's greedy answers to them)."""
    from transformers import AutoModelForCausalLM

    from draftheads import load_target
    from draftheads.decoding.generate import speculative_generate
    from draftheads.evaluation.engine_eval import engine_settings
    from draftheads.interop.native import save_drafter
    from draftheads.interop.shipped_mtp import shipped_drafter
    from draftheads.measurement.conversations import first_chat, load_conversations
    from draftheads.training.features import target_features
    from tests.fixtures import make_config, shipped_mtp_checkpoint

    where = tmp_path_factory.mktemp("llama-cpp-mtp")
    _, tokenizer = load_target("smollm2-135m", dtype="fp32", device="cpu")
    config = make_config("qwen3_5_text", len(tokenizer), num_hidden_layers=5, **QWEN35)
    checkpoint = shipped_mtp_checkpoint(config, tokenizer, where / "qwen3.5-tiny")
    target = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).requires_grad_(False).eval()
    prompts = where / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    settings = engine_settings(target, tokenizer, 48)
    conversations, _, _ = load_conversations(str(prompts), None, tokenizer, settings)
    rows = []
    for conv in conversations:   # the ids the engine eval sends, and the target's greedy answer
        ids = torch.tensor(first_chat(tokenizer, conv, settings).input_ids)
        rows.append(torch.cat([ids, speculative_generate(target, None, ids, 48, eos_token_id=[]).tokens[0]]))
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    mask = torch.stack([torch.arange(width) < len(r) for r in rows]).long()
    drafter = shipped_drafter(target)
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask,
             "features": target_features(target, ids, mask, drafter.feature_layers)}
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    torch.manual_seed(0)
    drafter.train()
    for _ in range(120):
        loss, _ = drafter.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    target.name_or_path = str(checkpoint)
    return target, tokenizer, prompts, save_drafter(drafter.eval(), where / "drafter", target=target)


def test_llama_cpp_runs_the_fine_tuned_mtp_layer_with_our_loops_acceptance(tuned, tmp_path):
    from draftheads.evaluation.engine_eval import run_engine_eval
    from draftheads.evaluation.eval_config import EngineEvalConfig

    target, tokenizer, prompts, drafter = tuned
    config = EngineEvalConfig(prompts=str(prompts), limit=2, max_new_tokens=48, draft_tokens=[3], ngram=False,
                              dtype="fp32", threads=2)
    folder = run_engine_eval([str(drafter)], config, target_model=(target, tokenizer), out=str(tmp_path / "report"))
    rows = {r["config"]: r for r in json.loads((folder / "report.json").read_text())["results"]}
    mtp = next(r for name, r in rows.items() if name.endswith("n=3"))
    assert all(r["greedy_mismatches"] == 0 for r in rows.values())
    assert mtp["accepted"] > 0 and (folder / "gguf").is_dir()
    # the engine's tokens per target pass against our loop's tau for the same layer on the same prompts: equal on
    # this machine (3.90 and 3.90 per 40 tokens in the probe), 5% the goal
    assert abs(mtp["tau_gap"]) <= 0.05, (mtp["tokens_per_pass"], mtp["our_tau"])
