"""Strict (lossless) acceptance emits exactly the target's distribution.

1. Exact: the law of the token emitted at a node, enumerated over every draw of its children, equals p.
2. Statistical: 10^5 independent speculative steps on a toy Markov target with an unrelated (poor) Markov
   drafter, completed to a fixed length by plain target sampling; every adjacent pair of emitted tokens is
   chi-square tested against its exact law. Chains K in {1, 3, 5}, trees of width 2-4, T in {0.1, 0.3, 0.6,
   1, 1.5}, top-k and top-p, children sampled without replacement (q given, padded where q underflowed) or
   deterministic (q None), and trees auto_tree builds from irregular accuracy tables.
3. Deliberately broken rules (resample from p instead of the residual; forget that siblings were drawn
   without replacement) fail both checks; the point-mass rule applied to sampled children does not (it is
   exact for any way of drawing the children, only less efficient).
"""

from __future__ import annotations

import pytest
import torch

from draftheads.core.sampling import warp_probs
from draftheads.core.tree import Tree
from draftheads.decoding import accept as rules
from draftheads.decoding.tree_tensors import depth_tensor

V = 10
TARGET = 1.5 * torch.randn(8, V, V, generator=torch.Generator().manual_seed(0))   # logits [depth, prev token, V]
DRAFT = 1.5 * torch.randn(8, V, V, generator=torch.Generator().manual_seed(1))    # an unrelated, poor drafter
ROOT = 3
ROWS = 100_000
P_MIN = 1e-4   # per-check p-value threshold; every check is deterministic (fixed seeds)


def wide_tree(width: int) -> Tree:
    """`width` children at the root and under its first child, a grandchild chain, and a second branch."""
    return Tree.from_paths([(i,) for i in range(width)] + [(0, i) for i in range(width)]
                           + [(1, 0), (0, 0, 0), (0, 1, 0)])


# ---- exact enumeration --------------------------------------------------------------------------
def emitted_law(p: torch.Tensor, q: torch.Tensor | None, kids: list[int], width: int) -> torch.Tensor:
    """[V] exact law of the token a node emits with `width` children (drawn from q without replacement,
    or the fixed tokens `kids` when q is None), using the rule's own sibling / residual updates.
    `left` is what the drafter really has left to draw from; `rule_left` what the rule believes."""
    vocab = p.shape[0]
    out = torch.zeros_like(p)

    def walk(r, left, rule_left, j, prob):
        if j == width:
            out.add_(prob * r)
            return
        draws = [kids[j]] if left is None else (left > 0).nonzero()[:, 0].tolist()
        for x in draws:
            xt = torch.tensor([x])
            chance = 1.0 if left is None else float(left[x] / left.sum())
            q_j = rules.sibling_draft(None if rule_left is None else rule_left[None], xt, vocab)[0].double()
            a = min(1.0, float(r[x] / q_j[x]))
            out[x] += prob * chance * a
            if a < 1:
                next_left = None if left is None else left.scatter(0, xt, 0.0)
                next_rule = None if rule_left is None else rules.remove_drawn(rule_left[None], xt)[0]
                walk(rules.residual(r[None], q_j[None])[0], next_left, next_rule, j + 1, prob * chance * (1 - a))

    walk(p, q, q, 0, 1.0)
    return out


EXACT_CASES = [  # (V, width, temperature, top_k, top_p)
    (8, 1, 1.0, 0, 1.0), (12, 2, 0.6, 0, 1.0), (12, 3, 1.5, 0, 0.8), (20, 2, 1.0, 6, 1.0), (8, 4, 1.0, 0, 1.0),
]


def toy(vocab: int, seed: int, temperature: float, top_k: int, top_p: float):
    g = torch.Generator().manual_seed(seed)
    p = warp_probs(2 * torch.randn(vocab, generator=g), temperature, top_k, top_p).double()
    q = warp_probs(2 * torch.randn(vocab, generator=g), temperature).double()
    return p / p.sum(), q / q.sum()   # exactly normalised in float64


@pytest.mark.parametrize("vocab,width,temperature,top_k,top_p", EXACT_CASES)
@pytest.mark.parametrize("sampled", [True, False])
def test_emitted_law_is_exactly_p(vocab, width, temperature, top_k, top_p, sampled):
    p, q = toy(vocab, 7, temperature, top_k, top_p)
    kids = q.topk(width).indices.tolist()[::-1]   # deterministic children, some outside p's top
    law = emitted_law(p, q if sampled else None, kids, width)
    torch.testing.assert_close(law, p, atol=1e-9, rtol=0)


BROKEN = {
    "resample from p": ("residual", lambda r, q_j: r),
    "ignore that siblings were drawn without replacement": ("remove_drawn", lambda q_left, x: q_left),
}
POINT_MASS = ("sibling_draft", lambda q_left, x, vocab: torch.nn.functional.one_hot(x, vocab).float())


@pytest.mark.parametrize("broken", BROKEN)
def test_exact_check_rejects_broken_rules(broken, monkeypatch):
    name, fake = BROKEN[broken]
    monkeypatch.setattr(rules, name, fake)
    p, q = toy(V, 7, 1.0, 0, 1.0)
    law = emitted_law(p, q, [], 3)
    assert (law - p).abs().max() > 1e-3


def test_point_mass_rule_is_exact_whatever_drew_the_children(monkeypatch):
    """Treating every child as a point mass (accept x with prob r(x), else zero x) conditions on x, so it stays
    exact even for sampled children (only less efficient): not a bug, and the check must not flag it."""
    monkeypatch.setattr(rules, *POINT_MASS)
    p, q = toy(V, 7, 1.0, 0, 1.0)
    torch.testing.assert_close(emitted_law(p, q, [], 3), p, atol=1e-9, rtol=0)


def pruned_law(p: torch.Tensor, q: torch.Tensor, keep_second, point_masses: bool) -> torch.Tensor:
    """Exact law of the emitted token when two children are drawn from q without replacement and the
    second is kept only if keep_second(x2) (a choice that looks at the drawn value, like score-based pruning)."""
    vocab = p.shape[0]
    out = torch.zeros_like(p)
    for x1 in range(vocab):
        x1t = torch.tensor([x1])
        q1 = rules.sibling_draft(None if point_masses else q[None], x1t, vocab)[0].double()
        a1 = min(1.0, float(p[x1] / q1[x1]))
        out[x1] += q[x1] * a1
        r = rules.residual(p[None], q1[None])[0]
        left = rules.remove_drawn(q[None], x1t)[0]
        for x2 in range(vocab):
            chance = float(q[x1] * (1 - a1) * left[x2] / left.sum())
            if x2 == x1 or chance == 0:
                continue
            if not keep_second(x2):
                out += chance * r
                continue
            x2t = torch.tensor([x2])
            q2 = rules.sibling_draft(None if point_masses else left[None], x2t, vocab)[0].double()
            a2 = min(1.0, float(r[x2] / q2[x2]))
            out[x2] += chance * a2
            out += chance * (1 - a2) * rules.residual(r[None], q2[None])[0]
    return out


def test_value_dependent_pruning_needs_point_masses():
    """Why Proposal.q must be None for trees pruned by the drafted values (EAGLE-2 dynamic trees): the q rule
    is then biased, the point-mass rule stays exact."""
    p, q = toy(8, 3, 1.0, 0, 1.0)
    likely = lambda x: bool(q[x] >= q.sort().values[-3])
    torch.testing.assert_close(pruned_law(p, q, lambda x: True, point_masses=False), p, atol=1e-9, rtol=0)
    torch.testing.assert_close(pruned_law(p, q, likely, point_masses=True), p, atol=1e-9, rtol=0)
    assert (pruned_law(p, q, likely, point_masses=False) - p).abs().max() > 1e-3


# ---- statistical tests on a Markov toy target ------------------------------------------------------
def draft(tree: Tree, temperature: float, sampled: bool, generator, sharpness: float = 1.0):
    """(tree, tokens [ROWS, N], q [ROWS, N, V] or None) as the drafters draft: children drawn without replacement
    from the drafter's Markov q, padded with q = 0 tokens where q underflowed (heads/parts/draft_tree.py), on the
    gap-free tree (Tree.compacted) when sampled; else its deterministic top-k. sharpness scales the draft
    logits (a large one underflows q at low temperatures)."""
    from draftheads.heads.parts.draft_tree import Sampling, child_distribution, choose_children

    tree = tree.compacted() if sampled else tree
    sampling = Sampling(temperature, generator=generator if sampled else None)
    tokens = torch.full((ROWS, tree.num_nodes), ROOT, dtype=torch.long)
    q = torch.zeros(ROWS, tree.num_nodes, V)
    for node, kids in enumerate(tree.children):   # node order: parents come first
        if kids:
            need = max(tree.ranks[c] for c in kids) + 1
            q[:, node] = child_distribution(sharpness * DRAFT[tree.depths[node], tokens[:, node]], sampling, need)
            picked = choose_children(q[:, node], need, sampling)
            tokens[:, list(kids)] = picked[:, [tree.ranks[c] for c in kids]]
    return tree, tokens, (q if sampled else None)


def speculative_sequences(tree: Tree, temperature, top_k, top_p, sampled: bool, seed: int,
                          sharpness: float = 1.0) -> torch.Tensor:
    """[ROWS, depth + 1] tokens: one strict step's emitted tokens, completed by plain target sampling."""
    g = torch.Generator().manual_seed(seed)
    tree, tokens, q = draft(tree, temperature, sampled, g, sharpness)
    table = warp_probs(TARGET, temperature, top_k, top_p)
    p = table[depth_tensor(tree)[None, :], tokens]
    result = rules.accept_strict(tree, tokens, p, q, g)
    length = tree.depth + 1
    rows = torch.arange(ROWS)
    out = torch.full((ROWS, length), -1, dtype=torch.long)
    for t in range(tree.depth):
        node = result.path[:, t + 1]
        out[:, t] = torch.where(node >= 0, tokens[rows, node.clamp(min=0)], -1)
    out[rows, result.num_accepted] = result.next_token
    for t in range(length):
        prev = out[:, t - 1] if t else torch.full((ROWS,), ROOT)
        plain = torch.multinomial(table[t, prev], 1, generator=g)[:, 0]
        out[:, t] = torch.where(out[:, t] < 0, plain, out[:, t])
    return out


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of counts against probs (cells expecting < 5 pooled; any count in an
    impossible cell gives 0)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts[probs <= 0].sum() > 0:
        return 0.0
    expected = counts.sum() * probs
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    stat = ((obs - exp) ** 2 / exp)[keep].sum()
    dof = torch.tensor(float(keep.sum() - 1))
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def worst_pvalue(sequences: torch.Tensor, temperature, top_k, top_p) -> float:
    """Smallest p-value over the pairs (y_{t-1}, y_t) of the emitted sequences (y_0 = the root)."""
    marginal = torch.nn.functional.one_hot(torch.tensor(ROOT), V).double()
    prev = torch.full((ROWS,), ROOT)
    worst = 1.0
    for t in range(sequences.shape[1]):
        step = warp_probs(TARGET[t], temperature, top_k, top_p).double()        # [V, V] P(y_t | y_{t-1})
        joint = marginal[:, None] * step
        counts = torch.bincount(prev * V + sequences[:, t], minlength=V * V).view(V, V)
        worst = min(worst, chi2_pvalue(counts, joint))
        marginal, prev = joint.sum(0), sequences[:, t]
    return worst


# (tree, temperature, top_k, top_p, children sampled from q?) covering every chain length, every width,
# every temperature, top-k and top-p, with both kinds of children
STAT_CASES = [
    ("chain1", 0.6, 0, 1.0, True), ("chain3", 1.0, 0, 1.0, True), ("chain5", 1.5, 0, 1.0, True),
    ("chain1", 1.0, 4, 1.0, False), ("chain3", 1.5, 0, 0.8, False), ("chain5", 0.6, 4, 0.8, True),
    ("chain3", 1.0, 0, 0.8, True), ("chain5", 1.0, 4, 1.0, False),
    ("width2", 0.6, 0, 1.0, True), ("width3", 1.0, 0, 1.0, True), ("width4", 1.5, 0, 1.0, True),
    ("width2", 1.0, 4, 1.0, False), ("width3", 0.6, 0, 0.8, False), ("width4", 1.0, 4, 0.8, True),
    ("width4", 1.0, 0, 1.0, False), ("width3", 1.5, 4, 1.0, True),
]
TREES = {f"chain{k}": Tree.chain(k) for k in (1, 3, 5)} | {f"width{w}": wide_tree(w) for w in (2, 3, 4)}


@pytest.mark.parametrize("tree,temperature,top_k,top_p,sampled", STAT_CASES)
def test_strict_emits_target_distribution(tree, temperature, top_k, top_p, sampled):
    sequences = speculative_sequences(TREES[tree], temperature, top_k, top_p, sampled, seed=11)
    assert worst_pvalue(sequences, temperature, top_k, top_p) > P_MIN


# Low temperatures, where the warped laws are nearly point masses: with sharpness 12 the draft's q underflows
# to fewer tokens than a node has children, so the wide trees get pads (q = 0) at most of their nodes.
LOW_T_CASES = [  # (tree, temperature, top_k, top_p, sampled, draft sharpness)
    ("chain3", 0.1, 0, 1.0, True, 1.0), ("width3", 0.1, 0, 1.0, True, 1.0), ("width4", 0.3, 0, 0.8, True, 1.0),
    ("chain5", 0.3, 4, 1.0, True, 1.0), ("width2", 0.1, 0, 1.0, False, 1.0), ("width4", 0.3, 4, 1.0, False, 1.0),
    ("width3", 0.1, 0, 1.0, True, 12.0), ("width4", 0.3, 0, 1.0, True, 12.0),
]


@pytest.mark.parametrize("tree,temperature,top_k,top_p,sampled,sharpness", LOW_T_CASES)
def test_strict_emits_target_distribution_at_low_temperatures(tree, temperature, top_k, top_p, sampled, sharpness):
    if sharpness > 1:   # the case is what it claims: many children are pads
        drafted, tokens, q = draft(TREES[tree], temperature, True, torch.Generator().manual_seed(11), sharpness)
        parents = torch.tensor(drafted.parents[1:])
        pads = q[:, parents].gather(2, tokens[:, 1:, None])[..., 0] == 0      # [ROWS, N - 1]
        assert pads.float().mean() > 0.1
    sequences = speculative_sequences(TREES[tree], temperature, top_k, top_p, sampled, seed=11, sharpness=sharpness)
    assert worst_pvalue(sequences, temperature, top_k, top_p) > P_MIN


# Trees auto_tree builds from irregular (non-monotone in rank) accuracy tables, which leave gaps in sibling
# ranks; the drafters draft them gap-free when sampling (the tree above is compacted the same way).
IRREGULAR_TABLES = {
    "issue": ([[0.5, 0.05, 0.08, 0.02], [0.4, 0.1]], 3),                           # -> (0,), (2,), (0, 0)
    "deep": ([[0.4, 0.1, 0.3], [0.2, 0.05, 0.25], [0.5, 0.02, 0.3]], 7),
}


@pytest.mark.parametrize("table", IRREGULAR_TABLES)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.3, 0, 0.8)])
def test_strict_is_exact_on_trees_auto_tree_builds_from_irregular_tables(table, temperature, top_k, top_p):
    from draftheads.costmodel.auto_tree import auto_tree

    tree = auto_tree(*IRREGULAR_TABLES[table])
    assert tree.paths != tree.compacted().paths       # a gap in some sibling ranks
    for sampled in (True, False):
        sequences = speculative_sequences(tree, temperature, top_k, top_p, sampled, seed=13)
        assert worst_pvalue(sequences, temperature, top_k, top_p) > P_MIN


@pytest.mark.parametrize("broken", BROKEN)
def test_statistical_check_rejects_broken_rules(broken, monkeypatch):
    name, fake = BROKEN[broken]
    monkeypatch.setattr(rules, name, fake)
    sequences = speculative_sequences(wide_tree(3), 1.0, 0, 1.0, True, seed=11)
    assert worst_pvalue(sequences, 1.0, 0, 1.0) < 1e-12


# ---- through the real generation loop ---------------------------------------------------------------
def small_target(vocab: int = 16, layers: int = 1):
    """A random llama (1 layer; EAGLE-3-style drafters fuse 3) with a 16-token vocabulary and a spread-out next-token
    distribution."""
    from transformers import AutoModelForCausalLM

    from tests.fixtures import make_config

    config = make_config("llama", vocab, num_hidden_layers=layers)
    config.eos_token_id = 1
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.requires_grad_(False).eval()


@torch.no_grad()
def two_token_law(model, prompt: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """[V, V] exact P(y1, y2) of plain sampling after `prompt` [1, s]."""
    vocab = model.config.vocab_size
    first = warp_probs(model(input_ids=prompt).logits[0, -1], temperature, top_k, top_p).double()
    grown = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
    second = warp_probs(model(input_ids=grown).logits[:, -1], temperature, top_k, top_p).double()
    return first[:, None] * second


def block_drafter(model, kind: str = "dflash", tree: str = "static:[(0,), (1,), (0, 0)]", **settings):
    """A random DFlash, DSpark or P-EAGLE drafter for the small target: every depth drafted at once from per-slot q
    (DSpark, and P-EAGLE with a Markov head: each node's children from its slot's q given the node's own token; a
    dynamic tree: the best nodes over per-slot draws, point masses)."""
    import draftheads
    from tests.heads.batches import perturb

    torch.manual_seed(2)
    size = {"dflash": {"block_size": 3}, "dspark": {"block_size": 2, "markov_rank": 4}}.get(kind, {"depths": 2})
    drafter = draftheads.build_drafter(kind, model, **size, **settings, default_tree=tree)
    perturb(drafter, scale=0.3)
    if getattr(drafter, "markov_head", None) is not None:
        with torch.no_grad():  # a Markov bias as wide as the slot logits, so drafts depend on the token before them
            drafter.markov_head.markov_w2.weight.mul_(30.0)
    return drafter.eval()


def scheduled_dspark(model):
    """A random DSpark drafter verifying a chain of 2 only as far as its confidences pay for: with these costs a
    draft is kept while its confidence c0 beats 1/2 (the second while c0 c1 beats (1 + c0) / 3), which the random
    confidence head makes depend on the token drafted before it."""
    from draftheads.heads.parts.dspark_drafting import VerifyCosts

    drafter = block_drafter(model, "dspark", "chain:2", verify="scheduled")
    drafter.set_verify_costs(VerifyCosts(draft_s=0.0, verify_s=(1.0, 1.5, 2.0)))
    return drafter


@pytest.mark.parametrize("kind", ["random", "dflash", "dflash-dynamic", "peagle", "peagle-markov", "suffix", "dspark",
                                  pytest.param("dspark-dynamic", marks=pytest.mark.slow), "dspark-scheduled"])
def test_real_loop_two_token_joint_matches_plain_sampling(kind, temperature=0.8, top_k=6, top_p=0.9):
    """speculative_generate with a deliberately poor drafter (q unrelated to the target, children sampled from it;
    or an untrained block drafter, whose per-slot q serves every node of a depth; or suffix decoding, whose drafts
    come from the outputs of the runs before, kept in its shared cache) emits (y1, y2) with plain sampling's joint
    law."""
    from draftheads.decoding.generate import speculative_generate
    from draftheads.decoding.suffix import SuffixDrafter
    from tests.decoding.stubs import RandomDrafter

    model = small_target(layers=3 if kind.startswith("peagle") else 1)
    prompt, runs = torch.tensor([[2, 5, 7, 3, 9]]), 1200
    tree = Tree.from_paths([(0,), (1,), (0, 0)])
    drafters = {"random": lambda: RandomDrafter(16, sampled=True, tree=tree), "suffix": lambda: SuffixDrafter(),
                "dflash-dynamic": lambda: block_drafter(model, "dflash", "dynamic:2,2,3"),
                "dspark-dynamic": lambda: block_drafter(model, "dspark", "dynamic:2,2,3"),
                "dspark-scheduled": lambda: scheduled_dspark(model),
                "peagle-markov": lambda: block_drafter(model, "peagle", markov_rank=4)}
    drafter = drafters[kind]() if kind in drafters else block_drafter(model, kind)
    counts = torch.zeros(16 * 16)
    accepted = 0
    length = 3 if kind == "suffix" else 2   # a third token, so the cache holds what followed y1 in earlier runs
    for seed in range(runs):
        out = speculative_generate(model, drafter, prompt, length, accept="strict", temperature=temperature,
                                   top_k=top_k, top_p=top_p, seed=seed, eos_token_id=[])
        y1, y2 = out.tokens[0, :2].tolist()
        counts[y1 * 16 + y2] += 1
        accepted += sum(out.stats.step_accepted)
    assert 0 < accepted < runs    # the drafter is poor but not useless: both branches of the rule ran
    assert chi2_pvalue(counts, two_token_law(model, prompt, temperature, top_k, top_p)) > P_MIN


# ---- the two cases an independent check found biased ---------------------------------------------

def first_emitted(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None, seed: int) -> torch.Tensor:
    """[rows] the first token each strict step emits: its first accepted draft, else its correction."""
    out = rules.accept_strict(tree, tokens, p, q, torch.Generator().manual_seed(seed))
    first = tokens.gather(1, out.path[:, 1:2].clamp(min=0))[:, 0]
    return torch.where(out.num_accepted > 0, first, out.next_token)


def test_padded_children_of_an_underflowed_draft_are_point_masses():
    """T=0.1 and a 12-logit gap leave one token in q, so the second root child is a pad with q = 0. Taken as a
    draw from q (ratio r / 1e-30) it was accepted whenever the target gave it mass: emitted [.6, 0, .4, 0, ...]
    instead of p = [.6, 0, .3, .1, 0, 0]."""
    from draftheads.heads.parts.draft_tree import Sampling, child_distribution, choose_children

    law = torch.tensor([0.6, 0.0, 0.3, 0.1, 0.0, 0.0])
    rows, vocab = 200_000, len(law)
    sampling = Sampling(temperature=0.1, generator=torch.Generator().manual_seed(0))
    draft_logits = torch.tensor([12.0, 0.0, 0.5, 0.0, 0.0, 0.0]).expand(rows, -1)
    q = child_distribution(draft_logits, sampling, need=2)  # fp32: everything but token 0 underflows to 0
    children = choose_children(q, 2, sampling)
    assert (q > 0).sum(-1).max() == 1 and (q.gather(1, children[:, 1:]) == 0).all()  # the second child is a pad
    tree = Tree.from_paths([(0,), (1,)])
    tokens = torch.cat([torch.full((rows, 1), ROOT), children], dim=1)
    p = law.expand(rows, tree.num_nodes, vocab).clone()
    q_nodes = torch.zeros(rows, tree.num_nodes, vocab)
    q_nodes[:, 0] = q
    counts = torch.bincount(first_emitted(tree, tokens, p, q_nodes, seed=1), minlength=vocab).double()
    assert counts[law == 0].sum() == 0
    assert chi2_pvalue(counts, law.double()) > P_MIN


def sampled_tree_law(paths, compact: bool, rows: int = 200_000, seed: int = 0) -> float:
    """p-value of the first emitted token against p when root children are drawn from q for the tree `paths`."""
    from draftheads.heads.parts.draft_tree import Sampling, draft_static

    g = torch.Generator().manual_seed(seed)
    vocab = 6
    p_law = torch.softmax(torch.randn(vocab, generator=g), -1)
    draft = torch.randn(vocab, generator=g)
    tree = Tree.from_paths(paths)
    tree = tree.compacted() if compact else tree
    sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(seed + 1))
    expand = lambda nodes, parents, tokens: draft.expand(tokens.shape[0], len(nodes), vocab)
    tokens, q = draft_static(tree, torch.full((rows,), ROOT), expand, sampling)
    p = p_law.expand(rows, tree.num_nodes, vocab)
    counts = torch.bincount(first_emitted(tree, tokens, p, q, seed=seed + 2), minlength=vocab).double()
    return chi2_pvalue(counts, p_law.double())


def test_trees_with_gaps_in_sibling_ranks_are_drafted_gap_free():
    """[(0,), (2,)]: the rank-2 child would be the third draw, after a second draw the tree leaves out and the rule
    never removes from q (chi-square 162.6 on 5 dof). Drafted as its gap-free version it is exact again."""
    assert Tree.from_paths([(0,), (2,), (2, 3)]).compacted().paths == ((0,), (1,), (1, 0))
    assert sampled_tree_law([(0,), (2,)], compact=False) < P_MIN  # the bias, still there without the compaction
    assert sampled_tree_law([(0,), (2,)], compact=True) > P_MIN
    assert sampled_tree_law([(0,), (1,)], compact=False) > P_MIN


@pytest.mark.parametrize("kind, cfg", [("medusa", {"num_heads": 2}), ("eagle", {}), ("mtp", {"depth": 2}),
                                       ("dflash", {"block_size": 3}), ("peagle", {"depths": 2}),
                                       ("dspark", {"block_size": 2, "markov_rank": 8})])
def test_every_drafter_drafts_a_gapped_tree_gap_free_when_sampling(kind, cfg):
    import draftheads
    from tests.fixtures import make_target

    target = make_target("llama")
    drafter = draftheads.build_drafter(kind, target, **cfg)
    ids = torch.randint(0, target.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
    drafter.observe(torch.cat([hidden[i] for i in drafter.feature_layers], -1), ids.roll(-1, dims=1))
    gapped = Tree.from_paths([(0,), (2,), (0, 0), (2, 1)])
    sampled = drafter.propose(gapped, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert sampled.tree.paths == ((0,), (1,), (0, 0), (1, 0)) and sampled.q is not None
    assert drafter.propose(gapped).tree.paths == gapped.paths  # top-k children: gaps are exact


def test_a_proposal_with_siblings_drawn_with_replacement_is_refused():
    """Passing q says the children were drawn from it without replacement; two equal siblings say otherwise."""
    from draftheads.core.drafter import Proposal
    from draftheads.core.errors import DraftheadsError
    from draftheads.decoding.generate import speculative_generate
    from tests.decoding.stubs import RandomDrafter

    class WithReplacement(RandomDrafter):
        def propose(self, tree, **kw):
            proposal = super().propose(tree, **kw)
            tokens = proposal.tokens.clone()
            tokens[:, 2] = tokens[:, 1]             # both root children the same draw
            return Proposal(proposal.tree, tokens, proposal.q)

    model, prompt = small_target(), torch.tensor([[2, 5, 7, 3, 9]])
    drafter = WithReplacement(16, sampled=True, tree=Tree.from_paths([(0,), (1,), (0, 0)]))
    with pytest.raises(DraftheadsError,
                       match=r"WithReplacement.propose drew token \d+ twice among the children of node 0"):
        speculative_generate(model, drafter, prompt, 4, accept="strict", temperature=1.0, eos_token_id=[])
    speculative_generate(model, drafter, prompt, 4, accept="greedy", eos_token_id=[])   # top-k children: q is None
