"""Medusa heads: zero init, distinct blocks, the loss against a hand computation, tree filling."""

import pytest
import torch
import torch.nn.functional as F

import draftheads
from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import warp_probs
from draftheads.core.tree import DynamicTreeSpec, Tree
from tests.heads.batches import make_batch, perturb, target_features


@pytest.mark.parametrize("lm_head", ["shared", "own"])
def test_untrained_heads_reproduce_the_targets_next_token_logits(tiny_target, lm_head):
    drafter = draftheads.build_drafter("medusa", tiny_target, num_heads=3, num_layers=2, lm_head=lm_head)
    ids = torch.randint(0, tiny_target.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = tiny_target(ids, output_hidden_states=True)
        for k in range(3):
            torch.testing.assert_close(drafter.head_logits(k, out.hidden_states[-1]), out.logits, rtol=0, atol=1e-5)


def test_blocks_are_distinct_modules_with_their_own_weights(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=3, num_layers=2)
    blocks = [block.linear for head in drafter.heads for block in head]
    assert len({id(b.weight) for b in blocks}) == 6
    hidden = llama_target.config.hidden_size
    assert sum(p.numel() for p in drafter.parameters()) == 6 * (hidden * hidden + hidden)
    with torch.no_grad():
        assert all(not b.weight.any() and not b.bias.any() for b in blocks)
        blocks[0].weight.fill_(1.0)
        assert all(not b.weight.any() for b in blocks[1:])


def _hand_loss(drafter, batch):
    """The Medusa loss computed position by position."""
    k_heads, decay = drafter.config.num_heads, drafter.config.loss_decay
    ids, att, lm, feats = batch["input_ids"], batch["attention_mask"], batch["loss_mask"], batch["features"]
    sums, correct, total = (torch.zeros(k_heads), torch.zeros(k_heads, dtype=torch.long),
                            torch.zeros(k_heads, dtype=torch.long))
    for k in range(k_heads):
        shift = k + 2  # head 1 predicts x_{t+2}
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1] - shift):
                if att[b, t] and att[b, t + shift] and lm[b, t + shift]:
                    logits = drafter.head_logits(k, feats[b, t])
                    sums[k] += F.cross_entropy(logits[None], ids[b, t + shift][None])
                    correct[k] += int(logits.argmax() == ids[b, t + shift])
                    total[k] += 1
    loss = sum(decay**k * sums[k] / total[k] for k in range(k_heads))
    return loss, sums, correct, total


@pytest.mark.parametrize("lm_head", ["shared", "own"])
def test_training_loss_matches_a_hand_computation(llama_target, lm_head):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=3, lm_head=lm_head, loss_decay=0.7)
    perturb(drafter, scale=0.3)
    batch = make_batch(llama_target, drafter.feature_layers, b=3, s=14, pad=4)
    loss, metrics = drafter.training_loss(batch)
    with torch.no_grad():
        want, sums, correct, total = _hand_loss(drafter, batch)
    torch.testing.assert_close(loss.detach(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics["loss_sum"], sums, rtol=1e-5, atol=1e-4)
    assert metrics["correct"].tolist() == correct.tolist()
    assert metrics["total"].tolist() == total.tolist()
    # every loss-masked real token is predicted once per head (the prompt is longer than the shifts)
    assert total.tolist() == [int((batch["loss_mask"] * batch["attention_mask"]).sum())] * 3


def test_packed_rows_never_predict_across_samples(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2)
    batch = make_batch(llama_target, drafter.feature_layers, b=1, s=10, pad=0)
    batch["loss_mask"][:] = 1
    batch["position_ids"] = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]])  # two samples of 4 and 6 tokens
    _, metrics = drafter.training_loss(batch)
    # head 1 (shift 2): sample A has t in {0, 1}, sample B has t in {4..7}; head 2 (shift 3): 1 + 3
    assert metrics["total"].tolist() == [6, 4]


def _observed(drafter, target, b=2, seed=3):
    ids = torch.randint(0, target.config.vocab_size, (b, 7), generator=torch.Generator().manual_seed(seed))
    feats = target_features(target, ids, None, drafter.feature_layers)
    drafter.reset()
    drafter.observe(feats, ids.roll(-1, dims=1))
    return feats[:, -1], ids.roll(-1, dims=1)[:, -1]


def test_greedy_proposal_takes_each_heads_rank_r_token(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=4)
    perturb(drafter, scale=0.3)
    feature, pending = _observed(drafter, llama_target)
    tree = drafter.default_tree
    assert 40 <= tree.num_nodes <= 60 and tree.depth == 4
    proposal = drafter.propose(tree)
    assert proposal.tree is tree and proposal.q is None
    assert proposal.tokens[:, 0].tolist() == pending.tolist()
    with torch.no_grad():
        ranked = [drafter.head_logits(k, feature).argsort(dim=-1, descending=True) for k in range(4)]
    for node in range(1, tree.num_nodes):
        want = ranked[tree.depths[node] - 1][:, tree.ranks[node]]
        assert proposal.tokens[:, node].tolist() == want.tolist()


def test_sampled_proposal_gives_q_per_node_and_distinct_siblings(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=3)
    perturb(drafter, scale=0.3)
    feature, _ = _observed(drafter, llama_target)
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    g = torch.Generator().manual_seed(0)
    proposal = drafter.propose(tree, temperature=0.7, top_p=0.95, generator=g)
    with torch.no_grad():
        q = warp_probs(torch.stack([drafter.head_logits(k, feature) for k in range(3)], 1), 0.7, 0, 0.95)
    for node in range(tree.num_nodes):
        d = tree.depths[node]
        want = q[:, d] if d < 3 else torch.zeros_like(q[:, 0])
        torch.testing.assert_close(proposal.q[:, node], want)
        kids = proposal.tokens[:, list(tree.children[node])]
        assert all(len(set(row.tolist())) == kids.shape[1] for row in kids)
        if node:
            assert bool((q[:, d - 1].gather(1, proposal.tokens[:, node : node + 1]) > 0).all())


def test_sampled_proposal_prunes_ranks_beyond_the_support(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2)
    perturb(drafter, scale=0.3)
    feature, _ = _observed(drafter, llama_target, b=1)
    tree = Tree.from_paths([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (2, 0)])
    proposal = drafter.propose(tree, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(proposal.tree.paths) == {(0,), (1,), (0, 0), (0, 1)}
    with torch.no_grad():
        top2 = drafter.head_logits(0, feature).topk(2).indices[0].tolist()
    assert sorted(proposal.tokens[0, 1:3].tolist()) == sorted(top2)


def test_first_draw_follows_the_warped_head_distribution(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=1)
    perturb(drafter, scale=0.5)
    feature, _ = _observed(drafter, llama_target, b=1)
    with torch.no_grad():
        q = warp_probs(drafter.head_logits(0, feature), 1.0, 4)[0]
    g, tree, n = torch.Generator().manual_seed(0), Tree.chain(1), 2000
    counts = torch.zeros_like(q)
    for _ in range(n):
        counts[drafter.propose(tree, temperature=1.0, top_k=4, generator=g).tokens[0, 1]] += 1
    assert 0.5 * float((counts / n - q).abs().sum()) < 0.04


def test_rejects_dynamic_trees_too_deep_trees_and_proposing_before_observing(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2)
    with pytest.raises(DraftheadsError, match="before observe"):
        drafter.propose(Tree.chain(2))
    _observed(drafter, llama_target)
    with pytest.raises(DraftheadsError, match="dynamic"):
        drafter.propose(DynamicTreeSpec(4, 3, 20))
    with pytest.raises(DraftheadsError, match="exceeds"):
        drafter.propose(Tree.chain(3))
    assert drafter.default_tree.depth == 2 and drafter.propose(drafter.default_tree).tree.depth == 2


def test_own_lm_head_is_copied_once_and_never_overwritten_by_a_later_bind(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2, lm_head="own")
    target_weight = llama_target.get_output_embeddings().weight
    assert torch.equal(drafter.lm_heads[1].weight, target_weight)
    assert drafter.lm_heads[0].weight.data_ptr() != target_weight.data_ptr()
    with torch.no_grad():
        drafter.lm_heads[0].weight.mul_(2)
    drafter.bind(llama_target)
    assert torch.equal(drafter.lm_heads[0].weight, 2 * target_weight)


def test_param_groups_put_all_heads_at_the_base_rate(llama_target):
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=2)
    (group,) = drafter.param_groups(1e-3)
    assert group["lr"] == 1e-3 and len(group["params"]) == len(list(drafter.parameters()))
    assert draftheads.build_drafter("medusa", llama_target, head_lr=5e-3).param_groups(1e-3)[0]["lr"] == 5e-3


def test_draft_vocabulary_drafts_and_trains_on_the_chosen_tokens_only(llama_target):
    """The shared lm_head's rows for the draft vocabulary: the same logits there, -inf elsewhere; labels
    outside it add no loss but count as misses; no weights are added; an own lm_head is refused."""
    full = draftheads.build_drafter("medusa", llama_target, num_heads=3)
    perturb(full, scale=0.3)
    narrow = draftheads.build_drafter("medusa", llama_target, num_heads=3, draft_vocab_size=40)
    narrow.load_state_dict({**full.state_dict(), "d2t": narrow.d2t, "t2d": narrow.t2d})
    vocab = llama_target.config.vocab_size
    narrow.set_draft_vocab(torch.arange(vocab).flip(0) % 31)  # ties broken by lower id: a scattered choice
    assert set(narrow.state_dict()) == set(full.state_dict()) | {"d2t", "t2d"}
    feature, _ = _observed(narrow, llama_target)
    wide, ref = narrow.draft_logits(feature, 3), full.draft_logits(feature, 3)
    torch.testing.assert_close(wide[..., narrow.t2d], ref[..., narrow.t2d].float())
    assert torch.isneginf(wide[..., ~narrow.t2d]).all()
    assert narrow.t2d[narrow.propose(Tree.chain(3)).tokens[:, 1:]].all()
    sampled = narrow.propose(Tree.from_paths([(0,), (1,), (0, 0)]), temperature=0.8,
                             generator=torch.Generator().manual_seed(0))
    assert narrow.t2d[sampled.tokens[:, 1:]].all() and (sampled.q[..., ~narrow.t2d] == 0).all()
    torch.testing.assert_close(sampled.q[:, 0], warp_probs(wide[:, 0], 0.8, 0, 1.0))
    batch = make_batch(llama_target, narrow.feature_layers, b=2, s=14, pad=2)
    _, metrics = narrow.training_loss(batch)
    _, full_metrics = full.training_loss(batch)
    assert metrics["total"].tolist() == full_metrics["total"].tolist()
    labels_inside = [int(narrow.t2d[batch["input_ids"][:, k + 2 :]].sum()) for k in range(3)]
    assert all(c <= n for c, n in zip(metrics["correct"].tolist(), labels_inside))


def test_own_lm_heads_over_a_draft_vocabulary_start_as_the_targets_rows_for_it(llama_target):
    """Own lm heads of draft_vocab_size rows: after the vocabulary is chosen (bound or not yet) each is the
    target lm_head's rows for it, so an untrained own drafter drafts exactly like a shared one."""
    vocab = llama_target.config.vocab_size
    counts = torch.arange(vocab).flip(0) % 31
    shared = draftheads.build_drafter("medusa", llama_target, num_heads=2, draft_vocab_size=40)
    shared.set_draft_vocab(counts)
    own = draftheads.build_drafter("medusa", llama_target, num_heads=2, lm_head="own", draft_vocab_size=40)
    assert own.lm_heads[0].weight.shape == (40, llama_target.config.hidden_size)
    own.set_draft_vocab(counts)  # bound: the rows are copied at once
    unbound = draftheads.heads.medusa.MedusaDrafter.from_target(llama_target.config, own.config)
    unbound.set_draft_vocab(counts)
    unbound.bind(llama_target)  # not bound when chosen: bind copies them
    rows = llama_target.get_output_embeddings().weight[shared.vocab.ids]
    for drafter in (own, unbound):
        assert all(torch.equal(head.weight, rows) for head in drafter.lm_heads)
    feature, _ = _observed(own, llama_target)
    torch.testing.assert_close(own.draft_logits(feature, 2), shared.draft_logits(feature, 2))
    with torch.no_grad():
        own.lm_heads[1].weight.mul_(2.0)  # trained weights survive a later bind
    own.bind(llama_target)
    assert torch.equal(own.lm_heads[1].weight, 2.0 * rows)
    batch = make_batch(llama_target, own.feature_layers, b=2, s=14, pad=2)
    _, metrics = own.training_loss(batch)
    assert all(c <= n for c, n in zip(metrics["correct"].tolist(), metrics["total"].tolist()))


@pytest.mark.parametrize("layout", ["full", "draft_vocab", "packed"])
def test_soft_labels_are_the_targets_own_distribution_of_each_predicted_token(llama_target, layout):
    """Head k at t against softmax of the target's logits for x_{t+k+2} (taken from the target's own
    forward, not the features), over the draft vocabulary's columns when there is one."""
    narrow = layout == "draft_vocab"
    drafter = draftheads.build_drafter("medusa", llama_target, num_heads=3, soft_labels=True,
                                       draft_vocab_size=40 if narrow else None)
    perturb(drafter, scale=0.3)
    if narrow:
        drafter.set_draft_vocab(torch.arange(llama_target.config.vocab_size).flip(0) % 31)
    batch = make_batch(llama_target, drafter.feature_layers, b=2, s=14, pad=0 if layout == "packed" else 3)
    if layout == "packed":
        batch["position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7]] * 2)
    loss, metrics = drafter.training_loss(batch)
    columns = drafter.vocab.ids if narrow else slice(None)
    with torch.no_grad():
        target_logits = llama_target(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ids, att, lm, feats = batch["input_ids"], batch["attention_mask"], batch["loss_mask"], batch["features"]
    positions = batch.get("position_ids", torch.arange(14).expand(2, 14))
    want, totals = 0.0, []
    for k in range(3):
        shift, losses = k + 2, []
        for b in range(2):
            for t in range(14 - shift):
                if att[b, t + shift] and lm[b, t + shift] and positions[b, t + shift] - positions[b, t] == shift:
                    p = target_logits[b, t + shift - 1, columns].float().softmax(-1)
                    losses.append(-(p * drafter.head_logits(k, feats[b, t]).float().log_softmax(-1)).sum())
        want += 0.8**k * torch.stack(losses).mean()
        totals.append(len(losses))
    torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-4, atol=1e-4)
    assert metrics["total"].tolist() == totals

