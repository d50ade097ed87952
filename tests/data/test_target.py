"""Target loading: frozen, eval mode, dtype, chat template; the embedded default (slow)."""

import copy
import time

import pytest
import torch

from draftheads import load_target
from draftheads.core.errors import DraftheadsError
from draftheads.data.hardware import resolve_dtype


def test_local_folder_loads_frozen_in_eval_mode(tiny_target_dir):
    model, tokenizer = load_target(str(tiny_target_dir), dtype="fp32", device="cpu")
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.dtype == torch.float32
    assert tokenizer.chat_template


def test_bf16_request_is_honoured(tiny_target_dir):
    model, _ = load_target(str(tiny_target_dir), dtype="bf16", device="cpu")
    assert model.dtype == torch.bfloat16


def test_auto_dtype_is_fp32_without_native_bf16(monkeypatch):
    import draftheads.data.hardware as hw

    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setattr(hw, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16


def test_missing_chat_template_is_an_error_unless_the_recipe_gives_one(tiny_target_dir, tmp_path):
    import shutil

    folder = tmp_path / "no-template"
    shutil.copytree(tiny_target_dir, folder)
    for name in ("chat_template.jinja",):
        (folder / name).unlink(missing_ok=True)
    cfg = folder / "tokenizer_config.json"
    import json

    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    with pytest.raises(DraftheadsError, match="no chat template; set target.chat_template .*or data.mode: completion"):
        load_target(str(folder), dtype="fp32", device="cpu")
    _, raw = load_target(str(folder), dtype="fp32", device="cpu", mode="completion")   # a base model: raw text
    assert raw.apply_chat_template([{"role": "user", "content": "def f():"}], tokenize=False) == "def f():"
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    _, tokenizer = load_target(str(folder), dtype="fp32", device="cpu", chat_template=str(template))
    assert tokenizer.chat_template.startswith("{% for m")


def test_completion_mode_refuses_a_chat_template_it_would_not_use(tokenizer):
    from draftheads.data.target import attach_chat_template

    with pytest.raises(DraftheadsError, match="chat_template is set but data.mode is completion.*; drop target.chat"):
        attach_chat_template(copy.copy(tokenizer), "{{ messages }}", "fixture", mode="completion")


def test_cuda_without_gpu_is_a_one_line_error(tiny_target_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DraftheadsError, match="no CUDA GPU"):
        load_target(str(tiny_target_dir), device="cuda")


@pytest.mark.slow
def test_embedded_smollm2_loads_from_cache_quickly():
    load_target("smollm2-135m", dtype="fp32")  # builds the cache on a fresh machine
    start = time.perf_counter()
    model, tokenizer = load_target("smollm2-135m", dtype="fp32")
    elapsed = time.perf_counter() - start
    print(f"second load of smollm2-135m: {elapsed:.1f} s")
    assert model.config.hidden_size == 576 and model.config.vocab_size == 49152
    assert model.config.num_hidden_layers == 30
    assert "<|im_start|>" in tokenizer.chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    ids = torch.tensor([ids if isinstance(ids, list) else ids["input_ids"]])
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]).strip()  # a real model says something


@pytest.mark.slow
def test_recipe_show_derives_smollm2_sizes(capsys):
    from draftheads.cli import main

    assert main(["recipe", "show", "eagle-smollm2"]) == 0
    out = capsys.readouterr().out
    assert "hidden_size: 576" in out and "vocab_size: 49152" in out and "num_layers: 30" in out
