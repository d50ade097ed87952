"""train.loss, train.depth_weights and head.init through the real training loop: used, saved with the run, and
refused in one line where a head cannot take them (their arithmetic: tests/heads/parts/test_objective.py and
test_target_init.py)."""

import json

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts.target_init import target_decoder_layers
from draftheads.training.loop import run_training
from tests.training.train_helpers import drafter_weights, tiny_recipe


def test_a_run_trains_with_the_recipes_loss_and_depth_weights(tmp_path, data_dir, llama_target):
    head = {"type": "eagle3", "ttt_steps": 2, "draft_vocab_size": 128}
    losses = {}
    for loss in ("kl", "lk_alpha"):
        run = run_training(tiny_recipe(data_dir, tmp_path / loss, head, max_steps=2, log_every=1, loss=loss,
                                       depth_weights=[1.0, 0.0]),
                           target=llama_target)
        losses[loss] = [h["loss"] for h in json.loads((run / "final" / "metrics.json").read_text())["history"]]
    assert all(torch.isfinite(torch.tensor(v)).all() for v in losses.values())
    assert losses["kl"] != losses["lk_alpha"]  # the setting reached the head


@pytest.mark.parametrize("head, train, message", [
    ({"type": "dspark", "block_size": 3}, {"loss": "jsd"}, "DSpark trains with its own"),
    ({"type": "medusa", "num_heads": 2}, {"depth_weights": [1.0, 1.0, 1.0]}, "lists 3 weights but this drafter trains"
                                                                           " 2 depths"),
])
def test_a_head_that_cannot_take_the_setting_refuses_before_training(tmp_path, data_dir, llama_target, head, train,
                                                                    message):
    with pytest.raises(DraftheadsError, match=message) as refused:
        run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=2, **train), target=llama_target)
    assert "\n" not in str(refused.value) and not (tmp_path / "run" / "step_000001").exists()


def test_head_init_target_layer_starts_the_draft_layer_as_the_targets_last(tmp_path, data_dir, llama_target):
    """One step at a negligible learning rate: the saved draft layer is still (within 1e-6) the target's last."""
    head = {"type": "eagle3", "draft_vocab_size": 128, "init": "target_layer"}
    run = run_training(tiny_recipe(data_dir, tmp_path / "run", head, max_steps=1, lr=1e-9, warmup_steps=0),
                       target=llama_target)
    saved = drafter_weights(run / "final" / "drafter")
    last = target_decoder_layers(llama_target)[-1]
    gate = next(v for k, v in saved.items() if k.endswith("mlp.gate_proj.weight"))
    assert torch.allclose(gate.float(), last.mlp.gate_proj.weight.float(), atol=1e-6)
