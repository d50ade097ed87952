"""A GGUF requantized to another type: quantized tensors quantized again (values within the new type's rounding),
float tensors and metadata copied, the file written atomically."""

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
