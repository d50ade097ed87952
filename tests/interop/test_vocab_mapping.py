"""Draft-vocabulary mappings in SpecForge's, speculators' and our forms: written, read back, and refused when wrong."""

import numpy as np
import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.interop.vocab_mapping import read_vocab_mapping, write_vocab_mappings

V = 50
CHOSEN = torch.tensor([0, 3, 4, 9, 20, 49])
D2T = CHOSEN - torch.arange(len(CHOSEN))


@pytest.fixture()
def maps(tmp_path):
    assert write_vocab_mappings(tmp_path, D2T, V) == ["vocab_mapping.pt", "d2t.npy", "t2d.npy"]
    return tmp_path


@pytest.mark.parametrize("name", ["vocab_mapping.pt", "d2t.npy"])
def test_each_form_reads_back_the_same_tokens(maps, name):
    assert torch.equal(read_vocab_mapping(str(maps / name), V), CHOSEN)


def test_specforge_file_holds_what_specforge_writes(maps):
    saved = torch.load(maps / "vocab_mapping.pt", weights_only=True)
    assert (torch.equal(saved["d2t"], D2T) and saved["t2d"].dtype == torch.bool
            and int(saved["t2d"].sum()) == len(CHOSEN))
    assert np.load(maps / "t2d.npy").dtype == np.bool_


def test_wrong_mappings_are_one_line_errors(maps, tmp_path):
    with pytest.raises(DraftheadsError, match="outside this target's vocabulary of 20"):
        read_vocab_mapping(str(maps / "d2t.npy"), 20)
    np.save(maps / "t2d.npy", np.zeros(V, dtype=bool))
    with pytest.raises(DraftheadsError, match="t2d does not mark the tokens its d2t maps to"):
        read_vocab_mapping(str(maps / "d2t.npy"), V)
    with pytest.raises(DraftheadsError, match="not found"):
        read_vocab_mapping(str(tmp_path / "nothing.pt"), V)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(DraftheadsError, match="cannot read .* as plain tensors"):
        read_vocab_mapping(str(tmp_path / "junk.pt"), V)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DraftheadsError, match="cannot read .* as a numpy array"):   # pickled objects are never loaded
        read_vocab_mapping(str(tmp_path / "objects.npy"), V)
