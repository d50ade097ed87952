"""EAGLE-3 drafters exported for llama.cpp: the GGUF holds what llama.cpp's loader reads (src/models/eagle3.cpp),
computes what our drafter computes when run the way llama.cpp's graph runs it, pairs only with its own target, and
every other drafter or target is a one-line refusal. (The slow tests in tests/engines/ run the files in llama.cpp.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from draftheads.api import build_drafter
from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts.layers import causal_visible
from draftheads.interop import llama_cpp
from draftheads.interop.export import export_drafter
from draftheads.interop.llama_cpp import DRAFTER_FILE, LAYOUTS, interleave_rope_rows, read_gguf
from draftheads.interop.native import save_drafter
from tests.fixtures import make_target

H, V, I, Q, KV, D, HEADS, KV_HEADS = 64, 384, 128, 64, 32, 16, 4, 2   # the tiny fixture target
VD = 100


def write_target_gguf(path, tokenizer, arch="llama", layers=4, hidden=H, vocab=V, licence=None):
    """A metadata-only GGUF standing in for the target: what the export reads of it (architecture, sizes, tokenizer,
    and general.license when given)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch=arch)
    if licence:
        writer.add_string("general.license", licence)
    writer.add_uint32(f"{arch}.block_count", layers)
    writer.add_uint32(f"{arch}.embedding_length", hidden)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [tokenizer.convert_ids_to_tokens(i) or f"<{i}>" for i in range(vocab)])
    writer.add_array("tokenizer.ggml.token_type", [1] * vocab)
    writer.add_uint32("tokenizer.ggml.eos_token_id", tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    """(target, EAGLE-3 drafter with noisy weights, its native folder, the target's GGUF)."""
    where = tmp_path_factory.mktemp("llama-cpp")
    target = make_target("llama", tokenizer)
    torch.manual_seed(5)
    drafter = build_drafter("eagle3", target, draft_vocab_size=VD)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    drafter.vocab.choose(torch.randint(0, 1000, (V,)))
    native = save_drafter(drafter, where / "native", target=target)
    return target, drafter, native, write_target_gguf(where / "target.gguf", tokenizer)


def export(setup, out, **kw):
    target, _, native, gguf = setup
    return export_drafter(native, "llama.cpp", out, target=target, target_gguf=gguf, **kw)


def resolve(shape: tuple[str, ...]) -> tuple[int, ...]:
    sizes = {"H": H, "2H": 2 * H, "3H": 3 * H, "I": I, "Q": Q, "KV": KV, "Vd": VD, "V": V, "D/2": D // 2}
    return tuple(sizes[s] for s in shape)


def test_the_gguf_holds_what_llama_cpps_loader_reads(setup, tmp_path):
    target, drafter, _, gguf = setup
    out = export(setup, tmp_path / "out")
    meta, tensors = read_gguf(out / DRAFTER_FILE)
    layout = LAYOUTS[0]
    expected = {t.key: resolve(t.shape) for t in layout.tensors if t.when is None}
    assert {name: shape for name, (shape, _) in tensors.items()} == expected
    for name, (shape, kind) in tensors.items():   # norms in F32, matrices in F16 (the default), d2t as I64
        assert kind == ("I64" if name == "d2t" else "F32" if len(shape) == 1 else "F16"), name
    assert set(layout.config) - {"tokenizer.*"} <= set(meta)
    assert meta["general.architecture"] == "eagle3" and meta["eagle3.block_count"] == 1
    assert (meta["eagle3.embedding_length"], meta["eagle3.feed_forward_length"]) == (H, I)
    assert (meta["eagle3.attention.head_count"], meta["eagle3.attention.head_count_kv"],
            meta["eagle3.attention.key_length"]) == (HEADS, KV_HEADS, D)
    assert meta["eagle3.vocab_size"] == V and meta["eagle3.target_hidden_size"] == H
    # the default layers of a 4-layer target are outputs 0, 1, 2: llama.cpp captures the inputs of layers 1, 2, 3
    assert drafter.config.feature_layers == [0, 1, 2] and meta["eagle3.target_layers"] == [1, 2, 3]
    assert meta["eagle3.norm_before_residual"] is False and meta["eagle3.norm_before_fc"] is False
    target_meta, _ = read_gguf(gguf)   # the vocabulary is the target GGUF's own, field for field
    assert {k: v for k, v in meta.items() if k.startswith("tokenizer.")} == \
        {k: v for k, v in target_meta.items() if k.startswith("tokenizer.")}
    record = json.loads((out / "draftheads_export.json").read_text())
    assert record["format"] == "llama.cpp" and (out / record["llama_cpp"]["target"]).is_file()
    assert "--spec-type draft-eagle3" in record["llama_cpp"]["command"]


def gguf_tensors(path) -> dict[str, torch.Tensor]:
    from gguf import GGUFReader

    return {t.name: torch.from_numpy(np.array(t.data)) for t in GGUFReader(str(path)).tensors}


def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_adjacent_pairs(x, pos, theta):
    """llama.cpp's RoPE for Llama (LLAMA_ROPE_TYPE_NORM): each head's ADJACENT pairs (2i, 2i+1) rotated by
    pos * theta^(-2i/D). x [n, heads, D]."""
    d = x.shape[-1]
    angle = pos[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angle.cos()[:, None].to(x.dtype), angle.sin()[:, None].to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def test_llama_cpps_graph_on_the_gguf_drafts_what_our_drafter_drafts(setup, tmp_path):
    """src/models/eagle3.cpp, recomputed from the exported tensors and metadata alone: the decoder attends over
    [attn_norm(emb); attn_norm_2(g)] with adjacent-pair RoPE and the raw g as residual, then output_norm, output, and
    scatters the draft logits into the target vocabulary through d2t."""
    target, drafter, _, _ = setup
    out = export(setup, tmp_path / "out", dtype="fp32")
    t, (meta, _) = gguf_tensors(out / DRAFTER_FILE), read_gguf(out / DRAFTER_FILE)
    eps, theta = meta["eagle3.attention.layer_norm_rms_epsilon"], meta["eagle3.rope.freq_base"]
    n = 5
    ids, carry, pos = torch.tensor([[3, 9, 27, 81, 243]]), torch.randn(1, n, H), torch.arange(n) + 7
    emb = target.get_input_embeddings()(ids)[0]
    x = torch.cat([rms(emb, t["blk.0.attn_norm.weight"], eps), rms(carry[0], t["blk.0.attn_norm_2.weight"], eps)], -1)
    q = rope_adjacent_pairs(F.linear(x, t["blk.0.attn_q.weight"]).view(n, HEADS, D), pos, theta)
    k = rope_adjacent_pairs(F.linear(x, t["blk.0.attn_k.weight"]).view(n, KV_HEADS, D), pos, theta)
    v = F.linear(x, t["blk.0.attn_v.weight"]).view(n, KV_HEADS, D)
    attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1),
                                          v.repeat_interleave(2, 1).transpose(0, 1), is_causal=True)
    h = carry[0] + F.linear(attn.transpose(0, 1).reshape(n, Q), t["blk.0.attn_output.weight"])
    m = rms(h, t["blk.0.ffn_norm.weight"], eps)
    h = h + F.linear(F.silu(F.linear(m, t["blk.0.ffn_gate.weight"])) * F.linear(m, t["blk.0.ffn_up.weight"]),
                     t["blk.0.ffn_down.weight"])
    draft = F.linear(rms(h, t["output_norm.weight"], eps), t["output.weight"])
    logits = torch.full((n, V), float("-inf")).index_copy(-1, t["d2t"], draft)
    with torch.no_grad():
        ours = drafter.vocab_logits(drafter.forward_layer(carry, ids, pos[None], causal_visible(None, 1, n)))[0]
    torch.testing.assert_close(logits, ours, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(t["fc.weight"], drafter.fc.weight.detach())


def test_interleaving_the_rope_rows_keeps_every_attention_score():
    """HF rotates each head's two halves together (rotate_half), llama.cpp adjacent pairs: with q and k rows reordered
    alike, every q.k score at every pair of positions is the same."""
    torch.manual_seed(0)
    heads, d, n = 3, 8, 6
    wq, wk, x, pos = torch.randn(heads * d, 5), torch.randn(heads * d, 5), torch.randn(n, 5), torch.arange(n).double()
    angle = pos[:, None] * 10000.0 ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = (torch.cat([angle, angle], -1).cos()[:, None].float(),
                torch.cat([angle, angle], -1).sin()[:, None].float())

    def hf_rope(y):   # [n, heads, d]
        return y * cos + torch.cat([-y[..., d // 2:], y[..., : d // 2]], -1) * sin

    hf = torch.einsum("ihd,jhd->hij", hf_rope((x @ wq.T).view(n, heads, d)), hf_rope((x @ wk.T).view(n, heads, d)))
    q = rope_adjacent_pairs((x @ interleave_rope_rows(wq, heads).T).view(n, heads, d), pos, 10000.0)
    k = rope_adjacent_pairs((x @ interleave_rope_rows(wk, heads).T).view(n, heads, d), pos, 10000.0)
    torch.testing.assert_close(torch.einsum("ihd,jhd->hij", q, k), hf, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,kind", [("bf16", "BF16"), ("fp32", "F32"), ("fp16", "F16")])
def test_export_dtype_sets_the_matrices_type(dtype, kind, setup, tmp_path):
    meta, tensors = read_gguf(export(setup, tmp_path / dtype, dtype=dtype) / DRAFTER_FILE)
    assert tensors["fc.weight"][1] == kind and tensors["output_norm.weight"][1] == "F32"
    assert meta["general.file_type"] == llama_cpp.FILE_TYPES[kind]


@pytest.mark.parametrize("change, message", [
    ({"arch": "qwen2"}, "architecture qwen2 \\(the drafter's target: llama\\)"),
    ({"vocab": V - 1}, f"vocabulary {V - 1} \\(the drafter's target: {V}\\)"),
    ({"layers": 30}, "layers 30 \\(the drafter's target: 4\\)"),
    ({"hidden": 576}, "hidden size 576"),
])
def test_a_target_gguf_of_another_model_is_refused(change, message, setup, tokenizer, tmp_path):
    target, _, native, _ = setup
    other = write_target_gguf(tmp_path / "other.gguf", tokenizer, **change)
    with pytest.raises(DraftheadsError,
                       match=f"other.gguf is not the target this drafter was trained for: .*{message}"):
        export_drafter(native, "llama.cpp", tmp_path / "out", target=target, target_gguf=other)
    assert not (tmp_path / "out").exists()


def test_a_target_without_a_gguf_file_asks_for_one(setup, tmp_path):
    target, _, native, _ = setup
    with pytest.raises(DraftheadsError, match="llama.cpp runs the target as a GGUF file .* pass --target PATH.gguf"):
        export_drafter(native, "llama.cpp", tmp_path / "out", target=target)


@pytest.mark.parametrize("kind, cfg", [("medusa", {"num_heads": 2}), ("eagle", {}), ("mtp", {"depth": 2})])
def test_other_drafters_are_refused_naming_what_llama_cpp_runs(kind, cfg, tokenizer, tmp_path):
    target = make_target("llama", tokenizer)
    native = save_drafter(build_drafter(kind, target, **cfg), tmp_path / "native", target=target)
    with pytest.raises(DraftheadsError) as err:
        export_drafter(native, "llama.cpp", tmp_path / "out", target=target)
    assert "\n" not in str(err.value) and "llama.cpp has no loader" in str(err.value)
    assert "it loads DFlash, DSpark, EAGLE-3 drafters only" in str(err.value)


def test_a_rope_scaling_llama_cpp_has_no_eagle3_path_for_is_refused(tokenizer, tmp_path):
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    target = make_target("llama", tokenizer, rope_parameters=yarn)
    native = save_drafter(build_drafter("eagle3", target, draft_vocab_size=VD), tmp_path / "native", target=target)
    with pytest.raises(DraftheadsError, match="'yarn' RoPE scaling has no EAGLE-3 path in llama.cpp"):
        export_drafter(native, "llama.cpp", tmp_path / "out", target=target, target_gguf=tmp_path / "unused.gguf")


def test_llama31_rope_becomes_rope_freqs(tokenizer, tmp_path):
    """Llama 3.1's scaling reaches llama.cpp as per-pair divisors: 1 for short wavelengths, `factor` for long ones."""
    llama31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    target = make_target("llama", tokenizer, rope_parameters=llama31)
    native = save_drafter(build_drafter("eagle3", target, draft_vocab_size=VD), tmp_path / "native", target=target)
    out = export_drafter(native, "llama.cpp", tmp_path / "out", target=target,
                         target_gguf=write_target_gguf(tmp_path / "t.gguf", tokenizer))
    freqs = gguf_tensors(out / DRAFTER_FILE)["rope_freqs.weight"]
    assert freqs.shape == (D // 2,) and freqs[0] == 1.0 and freqs[-1] == 8.0
    assert (freqs[1:] >= freqs[:-1]).all()   # longer wavelengths are slowed at least as much


def test_the_embedded_target_pairs_with_its_shipped_gguf(setup, monkeypatch, tmp_path):
    _, _, native, gguf = setup
    from draftheads.interop.native import SavedDrafter

    saved = SavedDrafter.read(native)
    saved.config["target"]["name"] = "smollm2-135m"
    monkeypatch.setattr(llama_cpp, "embedded_gguf", lambda alias: tmp_path / f"{alias}.gguf")
    assert llama_cpp.target_gguf(saved) == tmp_path / "smollm2-135m.gguf"
    assert llama_cpp.target_gguf(saved, gguf) == gguf
