"""A GGUF requantized to another type: quantized tensors quantized again (values within the new type's rounding),
float tensors and metadata copied, the file written atomically. A quantized GGUF as the target: loaded in fp32 under
dtype 'auto', and its (tied) lm_head read from the file by exports that copy it."""

import gguf
import numpy as np
import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.interop.gguf_targets import requantize_gguf


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_string("general.name", "tiny")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, weight


def test_requantized_tensors_change_type_and_stay_close(tiny_gguf, tmp_path):
    source, weight = tiny_gguf
    out = requantize_gguf(source, tmp_path / "out" / "tiny-q4_0.gguf", "q4_0")
    reader = gguf.GGUFReader(out)
    tensors = {t.name: t for t in reader.tensors}
    q = tensors["blk.0.attn_q.weight"]
    assert gguf.GGMLQuantizationType(q.tensor_type) == gguf.GGMLQuantizationType.Q4_0
    values = gguf.quants.dequantize(q.data, gguf.GGMLQuantizationType.Q4_0).reshape(4, 64)
    scale = np.abs(weight).reshape(4, 2, 32).max(-1, keepdims=True) / 8    # Q4_0: 16 levels per 32-value block
    assert np.all(np.abs(values.reshape(4, 2, 32) - weight.reshape(4, 2, 32)) <= scale * 1.01)
    assert not np.allclose(values, weight, atol=1e-3)     # it did change
    norm = tensors["blk.0.attn_norm.weight"]
    assert gguf.GGMLQuantizationType(norm.tensor_type) == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(norm.data), np.ones(64, dtype=np.float32))
    assert reader.fields["general.name"].contents() == "tiny"
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    assert [p.name for p in out.parent.iterdir()] == ["tiny-q4_0.gguf"]      # no staging file left


def test_unknown_types_are_refused(tiny_gguf, tmp_path):
    with pytest.raises(DraftheadsError, match="choose one of q4_0"):
        requantize_gguf(tiny_gguf[0], tmp_path / "x.gguf", "q3_k")
    assert not (tmp_path / "x.gguf").exists()


def test_an_out_that_cannot_be_written_is_refused_before_the_source_is_read(tiny_gguf, tmp_path):
    """Issue 52: the whole GGUF was read and quantized again before the write failed with a traceback."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(DraftheadsError, match="cannot write --out .*afile is a file, not a writable folder"):
        requantize_gguf(tmp_path / "not-read.gguf", tmp_path / "afile" / "q4_0.gguf", "q4_0")  # no such source
    with pytest.raises(DraftheadsError, match="is a folder; give --out a file name"):
        requantize_gguf(tiny_gguf[0], tmp_path, "q4_0")


# ---- a GGUF file as the target (issue 57) -----------------------------------------------------------------------

LLAMA_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


@pytest.fixture(scope="module")
def gguf_target(tmp_path_factory, tokenizer):
    """A tiny Llama as a Q8_0 GGUF with no output.weight (tied to token_embd, as Gemma's are), which transformers
    loads; (its path, the model it was written from)."""
    import json

    from tests.fixtures import make_target

    model = make_target("llama", tokenizer, tie_word_embeddings=True)
    state, c = {k: v.numpy() for k, v in model.state_dict().items()}, model.config
    path = tmp_path_factory.mktemp("gguf-target") / "tiny-q8_0.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(c.num_hidden_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_vocab_size(c.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))])
    writer.add_token_types([1] * len(tokenizer))
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m
                             for m in json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)

    def add(name, values):
        if values.ndim == 2:   # the matrices quantized, as a packed GGUF holds them; norms stay fp32
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    add("token_embd.weight", state["model.embed_tokens.weight"])
    add("output_norm.weight", state["model.norm.weight"])
    for i in range(c.num_hidden_layers):
        for ours, theirs in LLAMA_NAMES.items():
            add(f"blk.{i}.{ours}.weight", state[f"model.layers.{i}.{theirs}.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, model


def test_auto_dtype_is_fp32_for_a_packed_gguf_target(gguf_target, monkeypatch):
    """transformers' GGUF kernels compute in fp32: 'auto' asking bf16 there cast every matmul's input and output."""
    import torch

    from draftheads.data import hardware
    from draftheads.data.target import load_target
    from tests.fixtures import CHATML

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)   # where 'auto' is bf16 for other targets
    assert hardware.resolve_dtype("auto", "cpu") == torch.bfloat16
    model, _ = load_target(str(gguf_target[0]), device="cpu", chat_template=CHATML)
    assert model.dtype == torch.float32
    model, _ = load_target(str(gguf_target[0]), device="cpu", chat_template=CHATML, dtype="bf16")
    assert model.dtype == torch.bfloat16   # asked for: honoured


def test_a_gguf_targets_medusa_drafter_exports_for_vllm_with_the_tied_lm_head(gguf_target, tmp_path):
    """It answered "cannot read the target's lm_head from <the GGUF's folder>": the lm_head is read from the GGUF."""
    import torch
    from safetensors.torch import load_file

    from draftheads.api import build_drafter
    from draftheads.data.target import load_target
    from draftheads.interop.export import export_drafter
    from draftheads.interop.native import read_config, save_drafter
    from tests.fixtures import CHATML

    model, _ = load_target(str(gguf_target[0]), device="cpu", chat_template=CHATML)
    drafter = build_drafter("medusa", model)
    native = save_drafter(drafter, tmp_path / "native", target=model)
    assert read_config(native)["target"]["name"] == str(gguf_target[0])
    out = export_drafter(native, "vllm", tmp_path / "vllm")   # no --target: the recorded GGUF
    lm_head = load_file(str(out / "model.safetensors"))["lm_heads.0.weight"]
    torch.testing.assert_close(lm_head, model.get_output_embeddings().weight, rtol=0, atol=0)   # what it ran with
    original = gguf_target[1].get_output_embeddings().weight
    assert (lm_head - original).abs().max() <= original.abs().max() / 127   # Q8_0's rounding of the tied embedding


def test_a_gguf_targets_dspark_drafter_exports_for_deepspec_with_its_embedding(gguf_target, tmp_path):
    """DeepSpec's layout carries the target's embedding and lm_head: both read from the recorded GGUF (dequantized,
    what the target ran with), and the folder reads back as the same drafter."""
    import torch
    from safetensors.torch import load_file

    from draftheads.api import build_drafter
    from draftheads.data.target import load_target
    from draftheads.interop.export import export_drafter
    from draftheads.interop.load import load_drafter
    from draftheads.interop.native import save_drafter
    from tests.fixtures import CHATML

    model, _ = load_target(str(gguf_target[0]), device="cpu", chat_template=CHATML)
    drafter = build_drafter("dspark", model, block_size=3, num_layers=1, markov_rank=4)
    native = save_drafter(drafter, tmp_path / "native", target=model)
    out = export_drafter(native, "deepspec", tmp_path / "deepspec")   # no --target: the recorded GGUF
    tensors = load_file(str(out / "model.safetensors"))
    embedding = model.get_input_embeddings().weight
    torch.testing.assert_close(tensors["embed_tokens.weight"], embedding, rtol=0, atol=0)
    torch.testing.assert_close(tensors["lm_head.weight"], model.get_output_embeddings().weight, rtol=0, atol=0)
    again = load_drafter(out, model)
    for key, value in drafter.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], value, rtol=0, atol=0, msg=key)
