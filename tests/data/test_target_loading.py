"""How load_target loads a target folder: the attention kernel each family offers (issue 57: Gemma 2 has no SDPA in
transformers, and asking for it failed to load the target)."""

import torch

from draftheads.data.target import load_target
from tests.families import family_target


def test_a_family_without_sdpa_loads_with_eager_attention(tmp_path, tokenizer, tiny_target_dir):
    model = family_target("gemma2", tokenizer)
    model.save_pretrained(tmp_path / "gemma2")
    tokenizer.save_pretrained(tmp_path / "gemma2")
    loaded, _ = load_target(str(tmp_path / "gemma2"), dtype="fp32", device="cpu")   # asks for sdpa, the default
    assert loaded.config._attn_implementation == "eager"
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    llama, _ = load_target(str(tiny_target_dir), dtype="fp32", device="cpu")
    assert llama.config._attn_implementation == "sdpa"   # where it is offered, what was asked
