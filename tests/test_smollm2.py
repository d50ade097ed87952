"""The whole pipeline on the real embedded target (SmolLM2-135M-Instruct), at toy sizes: self-written
prompts -> target-generated rows with ChatML loss masks -> EAGLE training -> evaluation beside prompt
lookup, in fp32, where speculative greedy output must equal plain greedy output exactly."""

import json

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from draftheads import load_target

    return load_target("smollm2-135m", dtype="fp32", device="cpu")


def test_pipeline_on_the_real_target(smollm2, tmp_path, capsys):
    import datasets

    from draftheads.demo import run_demo

    model, tokenizer = smollm2
    overrides = {
        "data.num_prompts": 6, "data.max_new_tokens": 32, "data.batch_size": 8, "data.shard_size": 3,
        "data.prompts": [{"source": "self", "temperature": 0.7, "max_tokens": 48}],
        "train.max_steps": 3, "train.batch_size": 2, "train.eval_every": 3, "train.save_every": 3,
        "train.eval_fraction": 0.34, "train.dtype": "fp32", "log.trackers": [],
        "eval.limit": 2, "eval.max_new_tokens": 32,
    }
    out = run_demo(str(tmp_path / "demo"), target_model=smollm2, progress=False, **overrides)

    rows = datasets.load_from_disk(str(out / "data"))
    assert len(rows) >= 4
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for ids, mask in zip(rows["input_ids"], rows["loss_mask"]):
        text = tokenizer.decode(ids)
        assert text.count("<|im_start|>user") == 1 and "<|im_start|>assistant\n" in text
        answer = [t for t, m in zip(ids, mask) if m]
        assert answer and (answer[-1] == end_of_turn or len(answer) == 32)  # ends its turn or hits the budget
        assert "<|im_start|>" not in tokenizer.decode(answer)  # template tokens are never trained on

    summary = json.loads((out / "demo.json").read_text())
    assert {r["drafter"] for r in summary["results"]} >= {"prompt-lookup", "eagle"}
    assert all(r["greedy_mismatches"] == 0 for r in summary["results"])  # fp32: token for token
    assert "| prompt-lookup | greedy |" in capsys.readouterr().out


def test_speculative_greedy_equals_plain_on_the_real_target(smollm2):
    from draftheads import build_drafter, speculative_generate
    from draftheads.decoding.lookup import PromptLookupDrafter

    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list."}],
                                        add_generation_prompt=True)
    ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
    plain = speculative_generate(model, None, ids, max_new_tokens=40).tokens
    reference = model.generate(ids, max_new_tokens=40, do_sample=False)[:, ids.shape[1]:]
    assert torch.equal(plain, reference[:, : plain.shape[1]])
    torch.manual_seed(0)
    for drafter, tree in [(PromptLookupDrafter(), None), (build_drafter("eagle", model), "dynamic:4,3,12"),
                          (build_drafter("medusa", model, num_heads=3), "chain:3")]:
        out = speculative_generate(model, drafter, ids, max_new_tokens=40, tree=tree)
        assert torch.equal(out.tokens, plain), type(drafter).__name__
