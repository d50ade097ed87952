"""train.loss and train.depth_weights (heads/parts/objective.py): every loss against a hand computation, LK-alpha's
value and gradient where it is delicate, the depth schedules, and every head trained with every loss moving only
the drafter."""

import math

import pytest
import torch

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts.draft_vocab import IGNORE
from draftheads.heads.parts.objective import (LOSSES, Objective, acceptance, attach_objective, depth_weights,
                                              token_loss)
from tests.heads.batches import make_batch, snapshot

P = [0.5, 0.3, 0.15, 0.05]
Q = [0.1, 0.2, 0.3, 0.4]


def by_hand(kind: str, p: list[float], q: list[float], label: int) -> float:
    """Each loss written out term by term over plain floats (0 · log 0 = 0)."""
    def kl(a, b):
        return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)
    tv = 0.5 * sum(abs(x - y) for x, y in zip(p, q))
    alpha = sum(min(x, y) for x, y in zip(p, q))
    if kind == "kl":
        return -sum(x * math.log(y) for x, y in zip(p, q) if x > 0)
    if kind == "ce":
        return -math.log(q[label])
    if kind == "rkl":
        return kl(q, p)
    if kind == "jsd":
        m = [(x + y) / 2 for x, y in zip(p, q)]
        return 0.5 * kl(p, m) + 0.5 * kl(q, m)
    if kind == "tv":
        return tv
    if kind == "lk_alpha":
        return -math.log(alpha)
    lam = math.exp(-3.0 * alpha)
    return lam * kl(p, q) + (1 - lam) * tv


def log_of(probs: list[float]) -> torch.Tensor:
    """[1, V] log-probabilities, with -1e4 standing for log 0 (a logit softmax turns into exactly 0.0)."""
    return torch.tensor([[math.log(x) if x > 0 else -1e4 for x in probs]], dtype=torch.float64)


@pytest.mark.parametrize("kind", LOSSES)
def test_every_loss_matches_a_hand_computation(kind):
    logits = log_of(Q) + 1.7  # a shift of the logits leaves q unchanged
    target = log_of(P) if kind != "ce" else None
    got = token_loss(kind, logits, target, torch.tensor([2]))
    assert got.shape == (1,)
    assert float(got) == pytest.approx(by_hand(kind, P, Q, 2), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("kind", [k for k in LOSSES if k not in ("ce", "kl")])
def test_divergences_are_zero_when_the_draft_is_the_target(kind):
    assert float(token_loss(kind, log_of(P), log_of(P))) == pytest.approx(0.0, abs=1e-6)


def test_ce_skips_tokens_outside_the_draft_vocabulary():
    got = token_loss("ce", log_of(Q).repeat(2, 1), None, torch.tensor([1, IGNORE]))
    assert got.tolist() == pytest.approx([-math.log(0.2), 0.0], rel=1e-6)


def test_lk_alpha_value_and_gradient_at_p_equal_q():
    """α = 1 and the loss 0 at q = p, a minimum: its gradient with respect to the draft logits is 0 (min's tie splits
    the gradient, and what is left is orthogonal to the softmax's)."""
    logits = log_of(P).clone().requires_grad_(True)
    loss = token_loss("lk_alpha", logits, log_of(P))
    loss.sum().backward()
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-6)  # float32 inside
    assert logits.grad.abs().max() < 1e-6


def test_lk_alpha_at_disjoint_supports_is_finite_with_the_hand_gradient():
    """p on tokens {0, 1}, q all but e^-30 on {2, 3}: α ≈ q0 + q1 (~1e-13), -log α finite (computed in log space; a
    softmax-then-min would round α to 0 in float32). By hand, d(-log α)/dz_j = q_j - 1[j in S] q_j / α_S with S the
    tokens where q < p: a bounded gradient that moves mass onto p's support."""
    logits = torch.tensor([[-30.0, -30.0, 0.0, 0.0]], dtype=torch.float32, requires_grad=True)
    target = torch.tensor([[math.log(0.5), math.log(0.5), -1e4, -1e4]])
    loss = token_loss("lk_alpha", logits, target)
    loss.sum().backward()
    q = torch.softmax(logits.detach().double(), -1)[0]
    alpha = float(q[0] + q[1])
    assert torch.isfinite(loss).all() and float(loss.detach()) == pytest.approx(-math.log(alpha), rel=1e-4)
    expected = q.clone()
    expected[:2] -= q[:2] / alpha
    assert logits.grad[0].double().tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert float(acceptance(logits.detach(), target)) == pytest.approx(alpha, rel=1e-4)


def test_depth_schedules_and_their_scaling_to_the_heads_sum():
    own = [1.0, 0.8, 0.64]  # EAGLE's ttt_decay 0.8 over 3 steps: sum 2.44
    assert depth_weights(Objective(), own) == own
    fastmtp = depth_weights(Objective(depth_weights="fastmtp"), [1.0, 1.0, 1.0])
    assert [w / 3 for w in fastmtp] == pytest.approx([0.51, 0.31, 0.18], abs=0.005)  # FastMTP's published weights
    assert sum(depth_weights(Objective(depth_weights="uniform"), own)) == pytest.approx(2.44)
    dflash = depth_weights(Objective(depth_weights="dflash"), [1.0] * 7)
    assert dflash[1] / dflash[0] == pytest.approx(math.exp(-1 / 4))  # γ = 4 at 7 drafted slots, as DFlash at B = 8
    reach = depth_weights(Objective(depth_weights="reach"), [1.0] * 3, torch.tensor([5, 2, 9]),
                          torch.tensor([10, 10, 10]))
    assert reach == pytest.approx([3 / 1.6 * w for w in (1.0, 0.5, 0.1)])  # 1, acc_1, acc_1 · acc_2
    assert depth_weights(Objective(depth_weights=(2.0, 1.0, 1.0)), own) == pytest.approx([1.22, 0.61, 0.61])


# ---- every head, every loss ------------------------------------------------------------------------------------

HEADS = [
    ("medusa", {"num_heads": 2}, 2),
    ("eagle", {"ttt_steps": 2}, 2),
    ("eagle3", {"ttt_steps": 2, "draft_vocab_size": 128}, 2),
    ("mtp", {"depth": 2}, 2),
    ("dflash", {"block_size": 3, "loss": "kd", "draft_vocab_size": 128}, 2),
    ("peagle", {"depths": 2, "draft_vocab_size": 128}, 2),
]


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("head, cfg, depths", HEADS, ids=[h for h, _, _ in HEADS])
def test_every_head_trains_with_every_loss_and_only_the_drafter_moves(tiny_target, head, cfg, depths, kind):
    drafter = draftheads.build_drafter(head, tiny_target, **cfg)
    attach_objective(drafter, kind, "reach")
    batch = make_batch(tiny_target, drafter.feature_layers)
    before_target = snapshot(tiny_target)
    drafter.train()
    loss, metrics = drafter.training_loss(batch)
    loss.backward()
    assert torch.isfinite(loss) and metrics["loss_sum"].shape == (depths,)
    assert all(p.grad is None for p in tiny_target.parameters())
    grads = [p.grad for p in drafter.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads) and all(
        g is None or torch.isfinite(g).all() for g in grads)
    assert all(torch.equal(v, tiny_target.state_dict()[k]) for k, v in before_target.items())


def test_the_default_objective_is_each_heads_own_loss(tiny_target):
    """train.loss unset and train.loss set to the head's own give the same loss: nothing changed for old recipes."""
    for head, cfg, own in [("eagle3", {"ttt_steps": 2}, "kl"), ("medusa", {"num_heads": 2}, "ce"),
                           ("dflash", {"block_size": 3}, "ce")]:
        drafter = draftheads.build_drafter(head, tiny_target, **cfg).eval()
        batch = make_batch(tiny_target, drafter.feature_layers)
        default = drafter.training_loss(batch)[0]
        attach_objective(drafter, own, None)
        assert torch.equal(drafter.training_loss(batch)[0], default), head


@pytest.mark.parametrize("head, cfg, loss, weights, message", [
    ("dspark", {"block_size": 3, "markov_rank": 8}, "tv", None, "DSpark trains with its own"),
    ("dflash", {"block_size": 3}, "lk_alpha", None, "set head.loss: kd"),
    ("eagle3", {"ttt_steps": 2}, None, [1.0, 0.5, 0.25], "lists 3 weights but this drafter trains 2 depths"),
])
def test_objectives_a_head_cannot_train_with_are_refused_in_one_line(tiny_target, head, cfg, loss, weights, message):
    drafter = draftheads.build_drafter(head, tiny_target, **cfg)
    with pytest.raises(DraftheadsError, match=message) as refused:
        attach_objective(drafter, loss, weights)
    assert "\n" not in str(refused.value)


def test_harmonised_unroll_adds_the_top_k_term_and_stops_gradients_between_steps(tiny_target):
    """head.ttt_mode: harmonised (HASS). Its top-k term is -Σ p log q over the target's 10 likeliest tokens (by hand
    here), and step 1's loss no longer reaches the weights through step 0's outputs: with step 0 weighted 0, the
    gradient of fc (which only step 0's carry reads) is zero, while the teacher unroll's is not."""
    from draftheads.heads.parts.draft_layer import top_k_distillation

    p = torch.softmax(torch.arange(12.0), -1)[None]
    q_logits = torch.linspace(1, -1, 12)[None]
    top = p[0].topk(10)
    by_hand = -float((top.values * torch.log_softmax(q_logits[0], -1)[top.indices]).sum())
    assert float(top_k_distillation(q_logits, p.log())) == pytest.approx(by_hand, rel=1e-6)

    grads = {}
    for mode in ("teacher", "harmonised"):
        drafter = draftheads.build_drafter("eagle3", tiny_target, ttt_steps=2, ttt_mode=mode, input_noise=0.0)
        attach_objective(drafter, None, [0.0, 1.0])
        drafter.training_loss(make_batch(tiny_target, drafter.feature_layers))[0].backward()
        grads[mode] = drafter.fc.weight.grad.abs().sum()
    assert grads["harmonised"] == 0 and grads["teacher"] > 0
