"""EAGLE-1/2 and EAGLE-3: wiring, gradients, the training-time test, and cached tree drafting
checked against recomputing every chain from scratch without a cache."""

import pytest
import torch

from draftheads.core.config import build, to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.eagle import EagleConfig
from draftheads.heads.eagle3 import Eagle3Config
from draftheads.heads.factory import KINDS as HEAD_KINDS
from draftheads.heads.factory import new_drafter
from draftheads.heads.parts.common import decoder_layer_class, shift_mask
from draftheads.heads.parts.draft_layer import unroll
from tests.heads.batches import train_steps
from tests.margins import at_least, at_most

STATIC_TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (0, 0, 0, 0)])

DRAFT_FAMILIES = ["llama", "qwen3"]


# EAGLE-1/2, EAGLE-1/2 drafting among a draft vocabulary (rows of the target's lm_head), EAGLE-3.
KINDS = [False, "vocab", True]
KIND_IDS = ["eagle", "eagle-vocab", "eagle3"]


def make_drafter(target, eagle3=False, **overrides):
    """eagle3: False (EAGLE-1/2), True (EAGLE-3) or "vocab" (EAGLE-1/2 with a draft vocabulary)."""
    if eagle3:  # a draft vocabulary smaller than the target's, so the d2t mapping matters
        overrides.setdefault("draft_vocab_size", 200)
    cfg = Eagle3Config(**overrides) if eagle3 is True else EagleConfig(**overrides)
    torch.manual_seed(1)
    drafter = new_drafter(cfg, target.config).bind(target)
    if eagle3:
        drafter.set_draft_vocab(torch.arange(target.config.vocab_size).flip(0) % 97)
    return drafter.eval()


def features_of(target, drafter, ids):
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in drafter.feature_layers], dim=-1)


def make_batch(target, drafter, b=2, s=24, seed=0, generated=False):
    """Random tokens, or (generated) a 4-token random prompt continued greedily by the target."""
    ids = torch.randint(0, target.config.vocab_size, (b, 4 if generated else s),
                        generator=torch.Generator().manual_seed(seed))
    if generated:
        ids = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s - 4, min_new_tokens=s - 4,
                              do_sample=False)
    ones = torch.ones_like(ids)
    return dict(input_ids=ids, attention_mask=ones, loss_mask=ones, features=features_of(target, drafter, ids))


def reference_logits(drafter, features, next_tokens, path):
    """Children logits of the node reached by drafting `path` after the pending token, recomputed
    without cache or tree mask: plain causal forwards over [prefix; chain], one per depth."""
    carry, tokens = drafter.initial_carry(features), next_tokens
    for token in [None, *path]:
        if token is not None:
            carry = torch.cat([carry, out[:, -1:]], dim=1)
            tokens = torch.cat([tokens, token.view(1, 1)], dim=1)
        n = tokens.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
        out = drafter.forward_layer(carry, tokens, torch.arange(n)[None], causal)
    return drafter.vocab_logits(out[:, -1])[0]


@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
def test_from_target_wiring(tiny_target, eagle3):
    drafter = make_drafter(tiny_target, eagle3)
    hidden, vocab, layers = (tiny_target.config.hidden_size, tiny_target.config.vocab_size,
                             tiny_target.config.num_hidden_layers)
    if eagle3 is True:   # EAGLE-3's layer is a Llama layer by default, the class every engine builds
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        assert type(drafter.layer) is LlamaDecoderLayer and drafter.config.draft_layer == "llama"
    else:
        assert type(drafter.layer) is decoder_layer_class(tiny_target.config) is type(tiny_target.model.layers[0])
    target_params = {id(p) for p in tiny_target.parameters()}
    assert not target_params & {id(p) for p in drafter.parameters()}
    assert not any(k.startswith(("_embed", "_lm_head", "embed_tokens")) for k in drafter.state_dict())
    if eagle3 == "vocab":  # no weights of its own: the target lm_head's rows for the draft vocabulary
        assert set(drafter.state_dict()) == set(make_drafter(tiny_target).state_dict()) | {"d2t", "t2d"}
        out = torch.randn(3, hidden)
        full = tiny_target.lm_head(out).float()
        got = drafter.vocab_logits(out)
        torch.testing.assert_close(got[:, drafter.t2d], full[:, drafter.t2d])
        assert torch.isneginf(got[:, ~drafter.t2d]).all()
    if eagle3 is True:
        cfg = drafter.config
        assert drafter.feature_layers == (cfg.feature_layers[0] + 1, cfg.feature_layers[1] + 1,
                                          cfg.feature_layers[2] + 1, -1)
        assert max(cfg.feature_layers) < layers
        assert drafter.fc.weight.shape == (hidden, 3 * hidden) and drafter.fc.bias is None
        assert drafter.layer.self_attn.q_proj.in_features == 2 * hidden
        assert drafter.layer.self_attn.k_proj.in_features == 2 * hidden
        assert drafter.lm_head.weight.shape == (cfg.draft_vocab_size, hidden)
        assert drafter.t2d.shape == (vocab,) and drafter.d2t.shape == (cfg.draft_vocab_size,)
    else:
        assert drafter.feature_layers == (-1,)
        assert drafter.fc.weight.shape == (hidden, 2 * hidden) and drafter.fc.bias is not None
        assert isinstance(drafter.layer.input_layernorm, torch.nn.Identity)
    batch = make_batch(tiny_target, drafter, s=12)
    assert batch["features"].shape[-1] == hidden * len(drafter.feature_layers)
    loss, metrics = drafter.training_loss(batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert (metrics["correct"].shape == metrics["total"].shape == metrics["loss_sum"].shape
            == (drafter.config.ttt_steps,))


def test_config_round_trip():
    cfg = Eagle3Config(feature_layers=[1, 2, 3], draft_vocab_size=100, ttt_steps=3)
    assert to_dict(build(HEAD_KINDS["eagle3"][0], to_dict(cfg), "head")) == to_dict(cfg)


def test_a_head_written_with_the_old_eagle3_flag_is_read_as_its_kind(tiny_target, capsys):
    """Recipes and drafter folders from before `type: eagle3` said `type: eagle, eagle3: true` (with EAGLE-1/2's loss
    weights, which EAGLE-3 never read); `eagle3: false` is EAGLE-1/2 without EAGLE-3's settings."""
    from draftheads.heads.factory import head_config

    old = {"type": "eagle", "eagle3": True, "ttt_steps": 2, "feature_loss_weight": 1.0, "draft_vocab_size": 100}
    config = head_config(old)
    assert isinstance(config, Eagle3Config) and (config.ttt_steps, config.draft_vocab_size) == (2, 100)
    assert "head.eagle3: true is read as head.type: eagle3; write that instead" in capsys.readouterr().err
    saved = to_dict(EagleConfig()) | {"eagle3": False, "feature_layers": None, "draft_layer": None}
    assert head_config(saved) == EagleConfig()
    with pytest.raises(DraftheadsError, match="unknown key 'feature_layers'"):
        head_config({"type": "eagle", "feature_layers": [0, 1, 2]})


@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
def test_gradients_reach_only_the_drafter(tiny_target, eagle3):
    drafter = make_drafter(tiny_target, eagle3, ttt_steps=2).train()
    before = {k: v.clone() for k, v in tiny_target.state_dict().items()}
    batch = make_batch(tiny_target, drafter, s=12)
    loss, _ = drafter.training_loss(batch)
    loss.backward()
    assert all(p.grad is None for p in tiny_target.parameters())
    missing = [n for n, p in drafter.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reached {missing}"
    torch.optim.AdamW(drafter.parameters(), lr=1e-2).step()
    assert all(torch.equal(before[k], v) for k, v in tiny_target.state_dict().items())


@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
def test_unroll_matches_drafting_with_true_tokens(llama_target, eagle3):
    """Step j of the training-time test at position p is exactly depth-(j+1) drafting from
    anchor p - j along the true tokens (same keys visible, same positions)."""
    drafter = make_drafter(llama_target, eagle3, ttt_steps=3)
    batch = make_batch(llama_target, drafter, b=1, s=12)
    ids, feats = batch["input_ids"], batch["features"]
    with torch.no_grad():
        outs = list(unroll(drafter, feats, ids))
        for step, out in enumerate(outs):
            for p in (step, 5, 9):
                anchor = p - step
                path = ids[0, anchor + 2 : anchor + 2 + step]
                want = reference_logits(drafter, feats[:, : anchor + 1], ids[:, 1 : anchor + 2], path)
                got = drafter.vocab_logits(out[0, p])
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_packed_rows_do_not_attend_across_samples(llama_target):
    drafter = make_drafter(llama_target, ttt_steps=2)
    first, second = (make_batch(llama_target, drafter, b=1, s=10, seed=1),
                     make_batch(llama_target, drafter, b=1, s=14, seed=2))
    packed = {k: torch.cat([first[k], second[k]], dim=1) for k in first}
    packed["position_ids"] = torch.cat([torch.arange(10), torch.arange(14)])[None]
    with torch.no_grad():
        _, alone1 = drafter.training_loss(first)
        _, alone2 = drafter.training_loss(second)
        _, together = drafter.training_loss(packed)
    assert torch.equal(together["total"], alone1["total"] + alone2["total"])
    torch.testing.assert_close(together["loss_sum"], alone1["loss_sum"] + alone2["loss_sum"], rtol=1e-4, atol=1e-4)


def observe_prompt(target, drafter, s=14, split=9):
    """Observe a prompt in two parts, with a propose in between (its drafts must be dropped)."""
    ids = torch.randint(0, target.config.vocab_size, (1, s + 1), generator=torch.Generator().manual_seed(3))
    feats = features_of(target, drafter, ids)[:, :s]
    drafter.reset()
    drafter.observe(feats[:, :split], ids[:, 1 : split + 1])
    drafter.propose(STATIC_TREE)
    drafter.observe(feats[:, split:], ids[:, split + 1 :])
    return feats, ids[:, 1:]


@pytest.mark.parametrize("family", DRAFT_FAMILIES, indirect=True)  # llama-like and q/k-norm layers
@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("tree", [Tree.chain(4), STATIC_TREE], ids=["chain", "tree"])
def test_cached_drafting_matches_recompute(tiny_target, eagle3, tree):
    drafter = make_drafter(tiny_target, eagle3)
    feats, next_tokens = observe_prompt(tiny_target, drafter)
    greedy = drafter.propose(tree)
    sampled = drafter.propose(tree, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert greedy.tree is tree and greedy.q is None
    assert greedy.tokens.shape == (1, tree.num_nodes) and greedy.tokens[0, 0] == next_tokens[0, -1]
    for proposal in (greedy, sampled):
        for node in range(tree.num_nodes):
            kids = tree.children[node]
            if not kids:
                continue
            path = proposal.tokens[0, tree.ancestors(node)[1:]]
            want = reference_logits(drafter, feats, next_tokens, path)
            picked = proposal.tokens[0, list(kids)]
            if proposal.q is None:  # greedy children are the top-k, in rank order
                assert torch.equal(picked, torch.topk(want, len(kids)).indices)
            else:
                torch.testing.assert_close(proposal.q[0, node], want.softmax(-1), rtol=1e-4, atol=1e-5)
                assert len(set(picked.tolist())) == len(kids) and (proposal.q[0, node][picked] > 0).all()
        if proposal.q is not None:
            assert (proposal.q[0, list(tree.leaves)] == 0).all()


@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
def test_dynamic_tree(llama_target, eagle3):
    drafter = make_drafter(llama_target, eagle3)
    feats, next_tokens = observe_prompt(llama_target, drafter)
    spec = DynamicTreeSpec(top_k=3, depth=4, total_tokens=10)
    proposal = drafter.propose(spec)
    tree, tokens = proposal.tree, proposal.tokens
    assert tree.num_nodes == spec.total_tokens + 1 and tokens.shape == (1, tree.num_nodes)
    assert tree.depth <= spec.depth
    assert list(tree.paths) == sorted(tree.paths, key=lambda p: (len(p), p))
    assert all(p[:-1] in set(tree.paths) | {()} for p in tree.paths)  # parents kept
    score = [0.0] * tree.num_nodes
    for node in range(1, tree.num_nodes):  # cumulative draft log-prob, recomputed from scratch
        parent = tree.parents[node]
        logp = reference_logits(drafter, feats, next_tokens, tokens[0, tree.ancestors(parent)[1:]]).log_softmax(-1)
        score[node] = score[parent] + logp[tokens[0, node]].item()
        if tree.ranks[node] == 0:  # the best child comes first
            assert tokens[0, node] == logp.argmax()
    for node in range(1, tree.num_nodes):
        assert score[node] <= score[tree.parents[node]] + 1e-6
        elder = [c for c in tree.children[tree.parents[node]] if tree.ranks[c] < tree.ranks[node]]
        assert all(score[c] >= score[node] - 1e-6 for c in elder)


def test_set_draft_vocab_picks_most_frequent(llama_target):
    drafter = make_drafter(llama_target, eagle3=True, draft_vocab_size=5)
    vocab = llama_target.config.vocab_size
    counts = torch.zeros(vocab, dtype=torch.long)
    counts[[40, 7, 300, 12, 99, 150]] = torch.tensor([9, 9, 50, 3, 3, 3])  # ties broken by lower id
    drafter.set_draft_vocab(counts)
    assert drafter.vocab.ids.tolist() == [7, 12, 40, 99, 300]
    assert torch.equal(drafter.t2d.nonzero().flatten(), drafter.vocab.ids)
    assert drafter.t2d.sum() == 5 and torch.equal(drafter.vocab.ids - torch.arange(5), drafter.d2t)
    torch.testing.assert_close(drafter.lm_head.weight, llama_target.lm_head.weight[[7, 12, 40, 99, 300]])
    feats, _ = observe_prompt(llama_target, drafter)
    proposal = drafter.propose(STATIC_TREE, temperature=0.7, generator=torch.Generator().manual_seed(0))
    assert drafter.t2d[proposal.tokens[0, 1:]].all()
    assert (proposal.q[0, :, ~drafter.t2d] == 0).all()
    with pytest.raises(DraftheadsError, match="full vocabulary; set head.draft_vocab_size"):
        make_drafter(llama_target).set_draft_vocab(counts)
    eagle1 = make_drafter(llama_target, eagle3="vocab", draft_vocab_size=5)
    eagle1.set_draft_vocab(counts)
    assert eagle1.vocab.ids.tolist() == [7, 12, 40, 99, 300]
    observe_prompt(llama_target, eagle1)
    assert eagle1.t2d[eagle1.propose(STATIC_TREE).tokens[0, 1:]].all()


def loss_floor(drafter, batch) -> float:
    """The lowest loss training can reach: soft CE cannot go below the (draft-vocabulary-restricted) target's
    entropy at each unroll step's positions; EAGLE-1 weighs it by token_loss_weight (its feature loss can reach 0)."""
    config = drafter.config
    weight = getattr(config, "token_loss_weight", 1.0) if isinstance(config, EagleConfig) else 1.0
    floor = 0.0
    for step in range(config.ttt_steps):
        mask = shift_mask(batch, step + 2)
        target_f = batch["features"][:, step + 1 : step + 1 + mask.shape[1], -drafter.hidden_size :][mask]
        entropy = torch.special.entr(drafter.target_logits(target_f).softmax(-1)).sum(-1).mean().item()
        floor += config.ttt_decay**step * weight * entropy
    return floor


@pytest.mark.trains
@pytest.mark.parametrize("eagle3", KINDS, ids=KIND_IDS)
def test_training_reduces_loss(llama_target, eagle3):
    drafter = make_drafter(llama_target, eagle3, ttt_steps=1 if eagle3 is True else 2).train()
    batch = make_batch(llama_target, drafter, b=2, s=16, generated=True)
    if eagle3:  # as the training loop does
        drafter.set_draft_vocab(torch.bincount(batch["input_ids"].flatten(), minlength=llama_target.config.vocab_size))
    with torch.no_grad():
        floor = loss_floor(drafter, batch)
    losses, hits = train_steps(drafter, batch)
    # 0.150 / 0.149 / 0.095 (eagle, eagle-vocab, eagle3) under every kernel setting tried, 4x below the bound; the
    # hits rose by 15-17 of 32. (The floor was once the entropy for EAGLE-1 too, whose soft CE weighs 0.1: the
    # first loss lay below it and the bound held only because the difference was negative.)
    at_most((losses[-1] - floor) / (losses[0] - floor), 0.6, "loss above the floor, last / first")
    at_least(hits[-1] - hits[0], 1, "depth-1 hits gained")


def test_token_loss_on_a_random_share_of_positions(llama_target):
    """token_loss_fraction < 1: training counts the token loss on that share of positions (fresh draws each
    step) while the feature loss still averages over all; eval mode and fraction 1 count every position."""
    full = make_drafter(llama_target, input_noise=0.0)
    part = make_drafter(llama_target, input_noise=0.0, token_loss_fraction=0.25)
    part.load_state_dict(full.state_dict())
    batch = make_batch(llama_target, full, b=2, s=24)
    counted = int(shift_mask(batch, 2).sum())
    part.train()
    torch.manual_seed(0)
    _, metrics = part.training_loss(batch)
    assert int(metrics["total"][0]) == round(0.25 * counted)
    part.eval()
    loss_part, metrics_part = part.training_loss(batch)
    loss_full, metrics_full = full.training_loss(batch)
    assert int(metrics_part["total"][0]) == counted
    torch.testing.assert_close(loss_part, loss_full)
    part.train()
    torch.manual_seed(1)
    a = part.training_loss(batch)[0]
    torch.manual_seed(2)
    b = part.training_loss(batch)[0]
    assert not torch.equal(a, b)  # a different share each step
