"""P-EAGLE: the one-pass training forward sees exactly what drafting sees (every depth, packed rows), COD keeps nested
shares of the anchors, and a trained tiny drafter drafts what it learned."""

import pytest
import torch

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.heads.parts.peagle_training import cod_slots, parallel_forward, slot_visible
from tests.fixtures import make_target
from tests.heads.batches import (
    continuation_batch,
    decisive_target,
    perturb,
    row_batch,
    target_features,
    train_steps,
)
from tests.margins import at_least, at_most

DEPTHS = 4
CLOSE = {"atol": 1e-4, "rtol": 1e-4}  # fp32 sums over differently masked key sets


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3")


def peagle(target, **cfg):
    drafter = draftheads.build_drafter("peagle", target, **{"depths": DEPTHS, "cod_min": 1.0, **cfg})
    perturb(drafter, scale=0.2)
    return drafter.eval()


def drafted_outputs(drafter, target, ids: torch.Tensor, anchor: int) -> torch.Tensor:
    """The layer outputs of depths 1..D drafted after observing positions 0..anchor (x_{anchor+1} pending):
    [D, H]."""
    drafter.reset()
    features = target_features(target, ids[:, : anchor + 1], None, drafter.feature_layers)
    drafter.observe(features, ids[:, 1 : anchor + 2])
    state = drafter._drafting
    return torch.cat([state.root_out, state.slot_outputs(drafter, drafter.config.depths - 1)[0]], 0)


def check_every_slot(drafter, target, batch, samples):
    """Each trained output (depth 0 and every COD slot) equals the drafted one at its anchor; samples: (start, ids)
    of each packed sample."""
    with torch.no_grad():
        depth0, (anchor, depth, valid, out) = parallel_forward(drafter, batch, batch["features"])
    checked = 0
    for start, ids in samples:
        for a in range(ids.shape[1] - 1):
            drafted = drafted_outputs(drafter, target, ids, a)
            torch.testing.assert_close(depth0[0, start + a], drafted[0], **CLOSE)
            for i in ((anchor[0] == start + a) & valid[0]).nonzero()[:, 0].tolist():
                d = int(depth[0, i])
                torch.testing.assert_close(out[0, i], drafted[d], **CLOSE)
                checked += 1
    return checked


def test_every_trained_slot_equals_the_slot_drafted_at_its_anchor(target):
    drafter = peagle(target)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    batch = row_batch(ids, target_features(target, ids, None, drafter.feature_layers))
    # cod_min 1: every anchor whose label at depth d is in the row: 9 + 8 + 7 slots
    assert check_every_slot(drafter, target, batch, [(0, ids)]) == 9 + 8 + 7


def test_packed_samples_train_like_each_sample_alone(target):
    """Two samples in one row (positions restarting at 0): no slot of the second sees the first, none crosses."""
    drafter = peagle(target)
    g = torch.Generator().manual_seed(3)
    first, second = torch.randint(0, 300, (1, 7), generator=g), torch.randint(0, 300, (1, 9), generator=g)
    features = torch.cat([target_features(target, s, None, drafter.feature_layers) for s in (first, second)], 1)
    positions = torch.cat([torch.arange(7), torch.arange(9)])[None]
    batch = row_batch(torch.cat([first, second], 1), features, position_ids=positions)
    assert check_every_slot(drafter, target, batch, [(0, first), (7, second)]) == (4 + 3 + 2) + (6 + 5 + 4)


def test_cod_keeps_nested_shrinking_shares_whose_labels_count():
    ids = torch.arange(100, 140)[None].repeat(2, 1)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :10] = 0
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}

    class Config:
        depths, cod_ratio, cod_min = 6, 0.7, 0.2

    anchor, depth, valid = cod_slots(batch, Config, training=True)
    usable = 40 - 2 - 10 + 2  # anchors 8..37 have x_{a+2} counted: 30
    for row in range(2):
        kept = {d: set(anchor[row][valid[row] & (depth[row] == d)].tolist()) for d in range(1, 6)}
        for d in range(1, 6):
            assert len(kept[d]) == min(round(usable * max(0.7**d, 0.2)), usable - d)
            assert all(8 <= a and a + d + 2 <= 39 for a in kept[d])   # the label x_{a+d+2} counts and exists
            assert d == 1 or kept[d] <= kept[d - 1]   # a slot's earlier slots are trained too
    visible = slot_visible(anchor, depth, valid, None, 39)
    i = int((valid[0] & (depth[0] == 3)).nonzero()[0])
    a = int(anchor[0, i])
    assert visible[0, i, :39].tolist() == [k <= a for k in range(39)]
    chain = visible[0, i, 39:]
    assert sorted(depth[0][chain].tolist()) == [1, 2, 3] and set(anchor[0][chain].tolist()) == {a}


def test_a_tree_deeper_than_the_depths_is_refused_in_one_line(target):
    drafter = peagle(target)
    ids = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(1))
    with pytest.raises(DraftheadsError, match="exceeds the 4 depths P-EAGLE drafts"):
        speculative_generate(target, drafter, ids, 8, tree="chain:5")
    with pytest.raises(DraftheadsError, match="head.default_tree is 5 deep"):
        draftheads.build_drafter("peagle", target, depths=4, default_tree="chain:5")


def markov_peagle(target):
    """A random P-EAGLE with a Markov head wide enough to change the slots' argmax."""
    drafter = peagle(target, markov_rank=8, input_noise=0.0)
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(50.0)
    return drafter


def test_markov_slots_train_on_the_real_previous_token_and_draft_on_the_drafted_one(target):
    """Training's loss at every (anchor, depth) is the drafted slot's soft cross-entropy given the row's real token
    before it; drafting a chain gives each slot the token drafted before it instead."""
    drafter = markov_peagle(target)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(4))
    features = target_features(target, ids, None, drafter.feature_layers)
    with torch.no_grad():
        _, metrics = drafter.training_loss(row_batch(ids, features))
        loss_sum = torch.zeros(DEPTHS)
        for a in range(ids.shape[1] - 2):
            base = drafter.draft_logits(drafted_outputs(drafter, target, ids, a))
            for d in range(min(DEPTHS, ids.shape[1] - 2 - a)):   # slot d drafts x_{a+d+2} after x_{a+d+1}
                log_q = drafter.markov_logits(base[d], ids[0, a + d + 1]).log_softmax(-1)
                p = drafter.target_logits(features[0, a + d + 1, -drafter.hidden_size:]).float().softmax(-1)
                loss_sum[d] += -(p * log_q).sum()
        torch.testing.assert_close(metrics["loss_sum"], loss_sum, **CLOSE)
        proposal = drafter.propose(Tree.chain(DEPTHS))   # after the last observe: anchor 9, x_10 pending
        token, expected = ids[:, 10], []
        for d in range(DEPTHS):
            token = drafter.vocab.to_target(drafter.markov_logits(base[d][None], token).argmax(-1))
            expected.append(int(token))
    assert proposal.tokens[0, 1:].tolist() == expected
    assert drafter.vocab.to_target(base.argmax(-1)).tolist() != expected   # the slots alone draft another chain


@torch.no_grad()
def mean_drafted_tv(drafter, target, ids: torch.Tensor, first_anchor: int) -> float:
    """The mean total variation between each drafted slot's distribution and the target's own at that position,
    over every anchor from `first_anchor` and every depth whose token is in `ids`."""
    p = target(ids).logits[0].softmax(-1)   # p[t]: the target's law of x_{t+1}
    distances = []
    for a in range(first_anchor, ids.shape[1] - 2):
        q = drafter.draft_logits(drafted_outputs(drafter, target, ids, a)).softmax(-1)
        for d in range(min(drafter.config.depths, ids.shape[1] - 2 - a)):   # depth d + 1 drafts x_{a+d+2}
            distances.append(0.5 * (q[d] - p[a + d + 1]).abs().sum().item())
    return sum(distances) / len(distances)


@pytest.mark.trains
def test_a_trained_drafter_drafts_the_continuation_it_learned():
    """Trained on the target's own greedy continuation of a prompt, one pass drafts it: speculative decoding of that
    prompt accepts most of every chain.

    Margins, from 4 seeds x (native AMX, ATEN_CPU_CAPABILITY=avx2, =default) on a 2-core Xeon: mean drafted TV
    0.013-0.032 (untrained: 0.99), argmax hits at least 36/38 per depth (0.947), tau 3.90 (39 tokens in 10
    forwards) every time. On the fixtures' flat targets the same test missed its 0.9 hit rate on one CPU and its
    tau on another: near-ties decided by rounding (tests/heads/batches.decisive_target)."""
    target = decisive_target()
    torch.manual_seed(0)
    drafter = draftheads.build_drafter("peagle", target, depths=3, cod_min=1.0, input_noise=0.0)
    prompt, answer, batch = continuation_batch(target, drafter.feature_layers)
    drafter.train()
    losses, _ = train_steps(drafter, batch, steps=150, lr=3e-3)
    assert losses[-1] < losses[0]   # soft labels: the floor is the target's entropy, not 0
    drafter.eval()
    # the fit itself: a third of the worst mean TV measured, a tenth of the untrained drafter's
    at_most(mean_drafted_tv(drafter, target, batch["input_ids"], prompt.shape[1] - 1), 0.1, "mean drafted TV")
    _, metrics = drafter.training_loss(batch)
    # each depth's argmax is the target's token at 85%: room for 3-4 more misses per depth than the worst measured
    at_least((metrics["correct"] / metrics["total"]).min().item(), 0.85, "argmax hit rate, worst depth")
    out = speculative_generate(target, drafter, prompt, 40, eos_token_id=[])
    assert out.tokens.tolist() == answer.tolist()
    # of at most 3.9 (3 drafts and the bonus per forward; 39 tokens after the prefill's): 13 forwards, 3 more than
    # measured, still pass
    at_least(out.stats.tau, 3.0, "tau")
