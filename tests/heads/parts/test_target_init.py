"""head.init: target_layer (heads/parts/target_init.py): the draft layers start as the target's last layers and the
fusion passes the highest features through, on every family and every head that offers it."""

import pytest
import torch

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts.target_init import init_from_target, target_decoder_layers
from tests.heads.batches import make_batch

HEADS = [("eagle3", {}), ("peagle", {"depths": 2}), ("mtp", {"depth": 2}),
         ("dflash", {"block_size": 3, "num_layers": 2}), ("dspark", {"block_size": 3, "markov_rank": 4})]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float(), b.float())


@pytest.mark.parametrize("head, cfg", HEADS, ids=[h for h, _ in HEADS])
def test_draft_layers_start_as_the_targets_last_layers(tiny_target, head, cfg):
    drafter = draftheads.build_drafter(head, tiny_target, **cfg)
    init_from_target(drafter, tiny_target)
    layers = drafter.draft_layers()
    source = list(target_decoder_layers(tiny_target))
    # a stack of L layers starts as the target's last L; every MTP module as its last one
    originals = [source[-1]] * len(layers) if head == "mtp" else source[-len(layers):]
    copied = 0
    for layer, original in zip(layers, originals):
        theirs = dict(original.named_parameters())
        for name, mine in layer.named_parameters():
            if name not in theirs:
                continue
            if mine.shape == theirs[name].shape:
                assert same(mine, theirs[name]), name
            else:  # EAGLE-3's q/k/v over [emb; h]: h's columns are the target's
                assert same(mine[:, -theirs[name].shape[1]:], theirs[name]), name
            copied += 1
    assert copied >= 7  # q, k, v, o, the MLP's projections and the norms at least


@pytest.mark.parametrize("head, cfg", [h for h in HEADS if h[0] in ("eagle3", "dflash")], ids=["eagle3", "dflash"])
def test_the_fusion_starts_as_the_highest_features(tiny_target, head, cfg):
    drafter = draftheads.build_drafter(head, tiny_target, **cfg)
    init_from_target(drafter, tiny_target)
    features = make_batch(tiny_target, drafter.feature_layers)["features"]
    hidden = tiny_target.config.hidden_size
    fused = len(drafter.config.target_layers if head == "dflash" else drafter.config.feature_layers)
    highest = features[..., (fused - 1) * hidden: fused * hidden]
    carried = drafter.fc(features[..., : fused * hidden])
    assert torch.allclose(carried, highest, atol=1e-6)


def test_more_draft_layers_than_the_target_has_are_refused(tiny_target):
    layers = tiny_target.config.num_hidden_layers
    drafter = draftheads.build_drafter("dflash", tiny_target, block_size=3, num_layers=layers + 1)
    with pytest.raises(DraftheadsError, match="use head.init: random"):
        init_from_target(drafter, tiny_target)
