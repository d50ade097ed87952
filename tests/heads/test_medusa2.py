"""Medusa-2: LoRA on the target trained jointly with the heads, saved in PEFT format."""

import pytest
import torch
import torch.nn.functional as F

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.interop.native import save_drafter
from tests.fixtures import make_target
from tests.heads.batches import make_batch, perturb

LORA = dict(lora_r=2, lora_alpha=4, lora_dropout=0.0)


def _batch(target):
    batch = make_batch(target, (-1,), b=2, s=12)
    del batch["features"]  # Medusa-2 runs the target itself
    return batch


def test_kl_loss_is_zero_for_a_fresh_adapter_and_heads_see_the_targets_features():
    target = make_target("llama")
    drafter = draftheads.build_drafter("medusa2", target, num_heads=2, target_loss="kl", **LORA)
    assert drafter.trains_target
    perturb(drafter.medusa.heads)  # LoRA B stays zero: the adapted target equals the original
    batch = _batch(target)
    loss, metrics = drafter.training_loss(batch)
    assert float(metrics["target_loss_sum"]) == pytest.approx(0.0, abs=1e-5)
    with torch.no_grad(), drafter.adapted_target().disable_adapter():
        features = target(batch["input_ids"], attention_mask=batch["attention_mask"],
                          output_hidden_states=True).hidden_states[-1]
    heads_loss, head_metrics = drafter.medusa.heads_loss(features, batch)
    torch.testing.assert_close(loss, 0.2 * heads_loss, rtol=1e-5, atol=1e-6)
    assert metrics["total"].tolist() == head_metrics["total"].tolist()


def test_lm_loss_is_the_targets_next_token_cross_entropy_on_counted_tokens():
    target = make_target("llama")
    drafter = draftheads.build_drafter("medusa2", target, num_heads=1, **LORA)
    batch = _batch(target)
    _, metrics = drafter.training_loss(batch)
    with torch.no_grad():
        logits = target(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    counted = (batch["loss_mask"] * batch["attention_mask"]).bool()[:, 1:]
    want = F.cross_entropy(logits[:, :-1][counted], batch["input_ids"][:, 1:][counted], reduction="sum")
    torch.testing.assert_close(metrics["target_loss_sum"][0], want, rtol=1e-5, atol=1e-4)
    assert int(metrics["target_total"][0]) == int(counted.sum())


def test_a_training_step_moves_the_adapter_and_heads_but_never_the_base_weights():
    target = make_target("llama")
    drafter = draftheads.build_drafter("medusa2", target, num_heads=2, **LORA)
    base = {k: v.clone() for k, v in target.state_dict().items() if "lora_" not in k}
    lora = {k: v.clone() for k, v in target.state_dict().items() if "lora_B" in k}
    heads = drafter.medusa.heads[0][0].linear.weight.clone()
    groups = drafter.param_groups(1e-2)
    assert [g["lr"] for g in groups] == [4e-2, 1e-2]
    optimizer = torch.optim.AdamW(groups)
    drafter.train()
    drafter.training_loss(_batch(target))[0].backward()
    optimizer.step()
    after = target.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())
    assert all(not torch.equal(after[k], v) for k, v in lora.items())
    assert not torch.equal(drafter.medusa.heads[0][0].linear.weight, heads)


def test_native_round_trip_restores_heads_and_adapter(tmp_path):
    target = make_target("llama")
    drafter = draftheads.build_drafter("medusa2", target, num_heads=2, **LORA)
    perturb(drafter)  # heads and LoRA A/B (the registered target's trainable weights)
    save_drafter(drafter, tmp_path / "d", target=target)
    assert ({p.name for p in (tmp_path / "d" / "adapter").iterdir()}
            >= {"adapter_config.json", "adapter_model.safetensors"})
    loaded = draftheads.load_drafter(tmp_path / "d", make_target("llama"))
    assert set(loaded.state_dict()) == set(drafter.state_dict())
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    batch = _batch(target)
    drafter.eval(), loaded.eval()
    assert torch.equal(loaded.training_loss(batch)[0], drafter.training_loss(batch)[0])


def test_a_target_carrying_an_adapter_is_refused():
    target = make_target("llama")
    draftheads.build_drafter("medusa2", target, num_heads=1, **LORA)
    with pytest.raises(DraftheadsError, match="already carries"):
        draftheads.build_drafter("medusa2", target, num_heads=1, **LORA)
    with pytest.raises(DraftheadsError, match="lora_target_modules"):
        draftheads.build_drafter("medusa2", make_target("llama"), lora_target_modules=["nope_proj"], **LORA)


def test_a_head_written_with_the_old_medusa2_flag_is_read_as_its_kind(capsys):
    """Recipes and drafter folders from before `type: medusa2` said `type: medusa, medusa2: true`."""
    from draftheads.heads.factory import head_config

    old = {"type": "medusa", "medusa2": True, "num_heads": 2, "medusa2_loss": "kl", "medusa2_head_weight": 0.5,
           "lora_r": 4}
    config = head_config(old)
    assert ((config.type, config.num_heads, config.target_loss, config.heads_weight, config.lora_r)
            == ("medusa2", 2, "kl", 0.5, 4))
    assert "head.medusa2: true is read as head.type: medusa2" in capsys.readouterr().err
    plain = head_config({"type": "medusa", "medusa2": False, "num_heads": 3, "lora_r": 16, "medusa2_loss": "lm"})
    assert (plain.type, plain.num_heads) == ("medusa", 3)
