"""DSpark (heads/dspark.py): DeepSpec's slot labels and loss by hand, the Markov head's left-to-right drafting, and
confidence-scheduled verification (its rule by hand, and why it reads only the tokens before each draft)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding import accept as rules
from draftheads.heads.parts.dspark_drafting import VerifyCosts, scheduled_length
from draftheads.heads.parts.dspark_training import draft_weights, dspark_labels, dspark_loss
from tests.decoding.test_strict import P_MIN, chi2_pvalue
from tests.fixtures import make_target
from tests.heads.batches import make_batch, perturb, target_features


def drafter_for(target, **settings):
    torch.manual_seed(0)
    drafter = draftheads.build_drafter("dspark", target, **{"block_size": 3, "markov_rank": 8, **settings})
    perturb(drafter, scale=0.2)
    return drafter


def test_labels_are_the_next_tokens_and_count_as_a_prefix():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "loss_mask": torch.tensor([[0, 0, 1, 1, 0, 1, 1]])}
    anchor, valid = torch.tensor([[1, 2, 5]]), torch.tensor([[True, True, True]])
    labels, counted, prev = dspark_labels(batch, anchor, valid, 3)
    # slot j of the block at a predicts x_{a+j+1} from x_{a+j}
    assert labels[0, 0].tolist() == [12, 13, 14] and prev[0, 0].tolist() == [11, 12, 13]
    assert labels[0, 1, :2].tolist() == [13, 14] and prev[0, 1].tolist() == [12, 13, 14]
    # x_4 is not counted: the block at 1 stops before it, the block at 2 too (a later draft is never verified);
    # the block at 5 runs out of row after one slot
    assert counted[0].tolist() == [[True, True, False], [True, False, False], [True, False, False]]


def test_loss_matches_a_hand_computation():
    target = make_target("llama")
    drafter = drafter_for(target, draft_vocab_size=64, ce_weight=0.3, l1_weight=0.7, confidence_weight=0.5)
    drafter.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0).float())  # the 64 highest ids
    batch = make_batch(target, drafter.feature_layers)
    drafter.eval()  # a fixed anchor draw
    features, anchor, valid, out = drafter.anchored_blocks(batch)
    labels, counted, prev = dspark_labels(batch, anchor, valid, 3)
    loss, metrics = dspark_loss(drafter, out, anchor, labels, counted, prev, features[..., -drafter.hidden_size:])
    weights = draft_weights(3, drafter.config.gamma)
    lm_head = target.get_output_embeddings().weight.float()
    ids = drafter.vocab.ids
    total, norm = 0.0, 0.0
    for b, a, j in counted.nonzero().tolist():
        h = out[b, a, j].float()
        logits = h @ lm_head[ids].T + drafter.markov_head.markov_w2.weight.float() @ \
            drafter.markov_head.markov_w1.weight[prev[b, a, j]].float()
        p = logits.softmax(-1)
        q = (features[b, anchor[b, a] + j, -drafter.hidden_size:].float() @ lm_head.T).softmax(-1)
        label = labels[b, a, j]
        ce = -logits.log_softmax(-1)[(ids == label).nonzero()[0, 0]] if (ids == label).any() else torch.tensor(0.0)
        l1 = (p - q[ids]).abs().sum() + q.sum() - q[ids].sum()  # the target's mass outside counts whole
        c = torch.cat([h, drafter.markov_head.markov_w1.weight[prev[b, a, j]].float()]) @ \
            drafter.confidence_head.proj.weight[0].float() + drafter.confidence_head.proj.bias[0].float()
        bce = F.binary_cross_entropy_with_logits(c, (1 - 0.5 * l1).clamp(0, 1))
        total += weights[j] * (0.3 * ce + 0.7 * l1 + 0.5 * bce)
        norm += weights[j]
    assert float(loss.detach()) == pytest.approx(float((total / norm).detach()), rel=1e-4)
    assert metrics["total"].tolist() == counted.sum((0, 1)).tolist()


def test_gradients_reach_only_the_drafter():
    target = make_target("llama")
    drafter = drafter_for(target)
    loss, _ = drafter.training_loss(make_batch(target, drafter.feature_layers))
    loss.backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in drafter.parameters() if p.requires_grad)
    assert not any(p.requires_grad or p.grad is not None for p in target.parameters())


def test_a_chain_is_drafted_left_to_right_with_the_markov_bias():
    target = make_target("llama")
    drafter = drafter_for(target).eval()
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.mul_(50.0)  # a bias that changes the argmax
    ids = torch.randint(0, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    features = target_features(target, ids, None, drafter.feature_layers)
    drafter.reset()
    drafter.observe(features, ids.roll(-1, dims=1))
    proposal = drafter.propose(Tree.chain(3))
    with torch.no_grad():
        hidden = drafter.run_block(drafter._drafting.root_token, 9, drafter._drafting.context)
        base = drafter.draft_logits(hidden)
    token, expected = drafter._drafting.root_token, []
    for j in range(3):  # each slot's draft given the token drafted before it
        token = (base[:, j] + drafter.markov_head.bias(token)).argmax(-1)
        expected.append(int(token))
    assert proposal.tokens[0, 1:].tolist() == expected
    independent = base.argmax(-1)[0].tolist()  # what the backbone alone drafts: not this chain
    assert independent != expected and hidden.shape == (1, 3, drafter.hidden_size)


def test_scheduled_length_by_hand():
    costs = VerifyCosts(draft_s=1.0, verify_s=(1.0, 1.2, 1.4, 3.0))
    # rate of L drafts: (1 + Σ P_j) / (1 + verify(L + 1)); P = 0.9, 0.72, 0.36 -> 1/2, 1.9/2.2, 2.62/2.4, 2.98/4.0
    assert scheduled_length([0.9, 0.8, 0.5], costs) == 2
    assert scheduled_length([0.05, 0.9], costs) == 0  # 1.05 / 2.2 < 1 / 2
    assert scheduled_length([1.0, 1.0, 1.0], VerifyCosts(0.0, (1.0,))) == 3  # verify costs beyond the table: the last
    with pytest.raises(DraftheadsError, match="verify costs must be positive"):
        VerifyCosts(0.0, (0.0,))


def test_scheduled_verification_cuts_the_chain_where_it_stops_paying():
    target = make_target("llama")
    drafter = drafter_for(target, verify="scheduled").eval()
    ids = torch.randint(0, target.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    drafter.observe(target_features(target, ids, None, drafter.feature_layers), ids.roll(-1, dims=1))
    free = drafter.propose(Tree.chain(3))
    drafter.set_verify_costs(VerifyCosts(draft_s=0.0, verify_s=(1.0, 1e-9 + 1.0, 1e-9 + 1.0, 1e-9 + 1.0)))
    assert drafter.propose(Tree.chain(3)).tokens.tolist() == free.tokens.tolist()  # extra tokens free: all kept
    drafter.set_verify_costs(VerifyCosts(draft_s=0.0, verify_s=(1.0, 100.0, 100.0, 100.0)))
    cut = drafter.propose(Tree.chain(3))
    assert cut.tree.num_nodes == 1 and cut.tokens.tolist() == free.tokens[:, :1].tolist()
    unscheduled = drafter_for(target).eval()
    unscheduled.set_verify_costs(VerifyCosts(draft_s=0.0, verify_s=(1.0, 100.0)))  # head.verify: all ignores costs
    assert unscheduled.verify_costs is None


def test_a_cut_decided_before_each_draft_is_drawn_keeps_strict_acceptance_exact():
    """The first emitted token over 200k steps whose roots differ: a draft kept by a confidence of its previous
    token (the root) emits p(· | root) exactly; kept by a confidence of the draft itself (peeking) it does not."""
    vocab, rows = 6, 200_000
    g = torch.Generator().manual_seed(0)
    p_law = torch.softmax(2 * torch.randn(2, vocab, generator=g), -1)  # the target after root 0 and root 1
    q_law = torch.softmax(2 * torch.randn(2, vocab, generator=g), -1)  # the draft's
    confidence = torch.rand(vocab, generator=g)  # per previous token
    costs = VerifyCosts(draft_s=0.0, verify_s=(1.0, 1.5))
    roots = torch.randint(0, 2, (rows,), generator=g)
    drafts = torch.multinomial(q_law[roots], 1, generator=g)[:, 0]

    def first_tokens(keep: torch.Tensor) -> torch.Tensor:
        out = torch.multinomial(p_law[roots], 1, generator=g)[:, 0]  # nothing verified: the target's own sample
        kept = keep.nonzero()[:, 0]
        tokens = torch.stack([roots[kept], drafts[kept]], 1)
        p = p_law[roots[kept]][:, None].expand(-1, 2, -1)
        q = q_law[roots[kept]][:, None].expand(-1, 2, -1)
        step = rules.accept_strict(Tree.chain(1), tokens, p, q, g)
        out[kept] = torch.where(step.num_accepted > 0, drafts[kept], step.next_token)
        return out

    def pvalues(keep):
        out = first_tokens(keep)
        return [chi2_pvalue(torch.bincount(out[roots == r], minlength=vocab).double(), p_law[r].double())
                for r in (0, 1)]

    by_root = torch.tensor([scheduled_length([float(confidence[r])], costs) for r in roots.tolist()]) > 0
    peeking = torch.tensor([scheduled_length([float(confidence[d])], costs) for d in drafts.tolist()]) > 0
    assert 0 < int(peeking.sum()) < rows
    assert min(pvalues(by_root)) > P_MIN
    assert min(pvalues(peeking)) < P_MIN


def test_settings_that_cannot_work_are_refused_in_one_line():
    target = make_target("llama")
    for settings, message in [({"markov_rank": 0}, "confidence_with_markov needs a Markov head"),
                              ({"confidence": False, "verify": "scheduled"}, "verify: scheduled needs the confidence"),
                              ({"ce_weight": 0.0, "l1_weight": 0.0}, "ce_weight \\+ l1_weight > 0"),
                              ({"default_tree": "chain:4"}, "4 deep, but a block of 3 drafts 3 levels")]:
        with pytest.raises(DraftheadsError, match=message):
            draftheads.build_drafter("dspark", target, block_size=3, **settings)
