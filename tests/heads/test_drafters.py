"""Every head type on every fixture family: shapes, wiring, a training step, save/load, drafting."""

import pytest
import torch

import draftheads
from draftheads.core.config import build as build_config
from draftheads.core.drafter import Drafter, TrainableDrafter
from draftheads.core.tree import Tree
from draftheads.heads.factory import KINDS, new_drafter
from draftheads.interop.native import save_drafter
from tests.fixtures import make_target
from tests.heads.batches import make_batch, perturb, snapshot, target_features

# (id, head type, config, number of depths trained)
VARIANTS = [
    ("medusa", "medusa", {"num_heads": 3}, 3),
    ("medusa-own", "medusa", {"num_heads": 2, "lm_head": "own"}, 2),
    ("eagle", "eagle", {"ttt_steps": 2}, 2),
    ("eagle3", "eagle3", {"ttt_steps": 3, "draft_vocab_size": 128}, 3),
    ("mtp", "mtp", {"depth": 2}, 2),
    ("dflash", "dflash", {"block_size": 4, "draft_vocab_size": 128}, 3),
    ("dflash-kd", "dflash", {"block_size": 3, "num_layers": 2, "loss": "kd"}, 2),
    ("peagle", "peagle", {"depths": 3, "draft_vocab_size": 128}, 3),
    ("dspark", "dspark", {"block_size": 3, "draft_vocab_size": 128, "markov_rank": 8}, 3),
    ("dspark-bare", "dspark", {"block_size": 2, "markov_rank": 0, "confidence": False}, 2),
]
CASES = [pytest.param(kind, cfg, depths, id=name) for name, kind, cfg, depths in VARIANTS]


def build(kind, target, cfg):
    drafter = draftheads.build_drafter(kind, target, **cfg)
    if drafter.vocab.restricted:  # a draft vocabulary that is not just the first ids
        counts = torch.randint(0, 100, (target.config.vocab_size,), generator=torch.Generator().manual_seed(0))
        drafter.set_draft_vocab(counts)
    return drafter


def test_every_head_type_is_covered():
    # Medusa-2: tests/heads/test_medusa2.py; the drafters targets ship, on the families that ship them:
    # tests/heads/test_native_mtp.py, tests/heads/test_assistant.py
    assert set(KINDS) <= {kind for _, kind, _, _ in VARIANTS} | {"medusa2", "native", "assistant"}


@pytest.mark.parametrize("kind, cfg", [(k, c) for _, k, c, _ in VARIANTS] + [("medusa2", {"lora_r": 2})],
                         ids=[name for name, *_ in VARIANTS] + ["medusa2"])
def test_every_drafter_offers_both_protocols(kind, cfg):
    """What the loop (Drafter) and training / the formats (TrainableDrafter) call is there on every module the
    factory builds."""
    drafter = draftheads.build_drafter(kind, make_target("llama"), **cfg)
    assert isinstance(drafter, Drafter) and isinstance(drafter, TrainableDrafter), type(drafter).__name__
    assert drafter.trains_target == (kind == "medusa2") and drafter.vocab.restricted == ("draft_vocab_size" in cfg)
    assert set(drafter.files.module.state_dict()) <= {k.removeprefix("medusa.") for k in drafter.state_dict()}


@pytest.mark.parametrize("kind, cfg, depths", CASES)
def test_loss_and_metrics_have_the_interface_shapes(tiny_target, kind, cfg, depths):
    drafter = build(kind, tiny_target, cfg)
    batch = make_batch(tiny_target, drafter.feature_layers)
    assert batch["features"].shape[-1] == len(drafter.feature_layers) * tiny_target.config.hidden_size
    loss, metrics = drafter.training_loss(batch)
    assert loss.shape == () and loss.requires_grad and torch.isfinite(loss)
    assert {"correct", "total", "loss_sum"} <= set(metrics)
    for key in ("correct", "total", "loss_sum"):
        assert metrics[key].shape == (depths,), key
    assert metrics["total"].dtype == torch.long and bool((metrics["total"] > 0).all())
    assert bool((metrics["correct"] <= metrics["total"]).all()) and bool((metrics["loss_sum"] > 0).all())


@pytest.mark.parametrize("kind, cfg, depths", CASES)
def test_from_target_is_deterministic_and_shares_nothing_with_the_target(tiny_target, kind, cfg, depths):
    config = build_config(KINDS[kind][0], {"type": kind, **cfg}, "head")
    torch.manual_seed(5)
    first = new_drafter(config, tiny_target.config).bind(tiny_target)
    torch.manual_seed(5)
    second = new_drafter(config, tiny_target.config).bind(tiny_target)
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())
    target_storage = {t.untyped_storage().data_ptr() for t in tiny_target.state_dict().values()}
    assert not any(t.untyped_storage().data_ptr() in target_storage for t in second.state_dict().values())
    layers = tiny_target.config.num_hidden_layers
    assert all(-(layers + 1) <= i <= layers for i in second.feature_layers)


@pytest.mark.parametrize("kind, cfg, depths", CASES)
def test_a_training_step_moves_only_drafter_parameters(tiny_target, kind, cfg, depths):
    drafter = build(kind, tiny_target, cfg)
    before_target, before = snapshot(tiny_target), snapshot(drafter)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    drafter.train()
    drafter.training_loss(make_batch(tiny_target, drafter.feature_layers))[0].backward()
    assert all(p.grad is None for p in tiny_target.parameters())
    trainable = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
    assert trainable and all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable.values())
    optimizer.step()
    assert all(torch.equal(v, tiny_target.state_dict()[k]) for k, v in before_target.items())
    after = drafter.state_dict()
    assert all(not torch.equal(after[n], before[n]) for n in trainable)


PROMPT_IDS = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(2))
PENDING = int(PROMPT_IDS[0, 0])  # next_tokens = the prompt shifted left; the last one wraps to x_0


def _draft(drafter, target, tree, generator=None):
    drafter.reset()
    features = target_features(target, PROMPT_IDS, None, drafter.feature_layers)
    drafter.observe(features, PROMPT_IDS.roll(-1, dims=1))
    return drafter.propose(tree, temperature=0.8 if generator else 0.0, generator=generator)


@pytest.mark.parametrize("kind, cfg, depths", CASES)
def test_save_then_load_gives_identical_outputs(tiny_target, tmp_path, kind, cfg, depths):
    drafter = build(kind, tiny_target, cfg)
    perturb(drafter)
    save_drafter(drafter, tmp_path / "d", target=tiny_target)
    loaded = draftheads.load_drafter(tmp_path / "d", tiny_target)
    assert type(loaded) is type(drafter) and loaded.config == drafter.config
    drafter.eval(), loaded.eval()
    batch = make_batch(tiny_target, drafter.feature_layers)
    assert torch.equal(loaded.training_loss(batch)[0], drafter.training_loss(batch)[0])
    tree = Tree.from_paths([(0,), (1,), (0, 0), (1, 0)])
    assert torch.equal(_draft(loaded, tiny_target, tree).tokens, _draft(drafter, tiny_target, tree).tokens)
    sampled = [_draft(d, tiny_target, tree, torch.Generator().manual_seed(4)) for d in (drafter, loaded)]
    assert torch.equal(sampled[0].tokens, sampled[1].tokens)


@pytest.mark.parametrize("kind, cfg, depths", CASES)
def test_proposal_is_rooted_at_the_pending_token(tiny_target, kind, cfg, depths):
    drafter = build(kind, tiny_target, cfg)
    perturb(drafter)
    proposal = _draft(drafter, tiny_target, drafter.default_tree)
    assert proposal.tokens.shape == (1, proposal.tree.num_nodes) and proposal.tree.num_nodes > 1
    assert int(proposal.tokens[0, 0]) == PENDING
    vocab = tiny_target.config.vocab_size
    assert bool(((proposal.tokens >= 0) & (proposal.tokens < vocab)).all())
