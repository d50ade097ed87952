"""Acceptance rules: which path of a verified draft tree to keep, and the next token.

Inputs shared by every rule (b rows are independent):
    tree    the proposal's shape, N nodes, node 0 = root (the pending token)
    tokens  [b, N] token at each node
    p       [b, N, V] the target's warped next-token distribution after each node (temperature,
            top-k, top-p already applied by sampling.warp_probs, exactly as plain sampling does)
    q       [b, N, V] or None: the distribution node i's children were drawn from (without
            replacement, in rank order); None = the children are deterministic (top-k, lookup)

Rules:
    greedy   accept a child iff its token is argmax p of its parent; longest accepted path;
             next token argmax p (whatever the temperature). It reads only argmaxes, so p may be the
             raw logits.
    strict   lossless recursive rejection sampling: at the current node try the children in rank
             order; child x_j is accepted with probability min(1, r(x_j) / q_j(x_j)), where r is the
             residual target (starts as p) and q_j the distribution x_j was drawn from (q with the
             earlier siblings removed and renormalised; a point mass on x_j when q is None). On
             rejection r <- norm(max(0, r - q_j)). Moving into an accepted child starts afresh with
             its p; when every child fails (or at a leaf) the next token is drawn from r.
             Why it is exact: given everything drawn before stage j, x_j ~ q_j, so
             P(out = y) = min(r(y), q_j(y)) + (1 - sum_x min(r(x), q_j(x))) * r'(y) = r(y), because
             the rejection mass equals the normaliser sum_x max(0, r(x) - q_j(x)) of r' (Leviathan,
             Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding", Appendix
             A.1; Chen et al. 2023, arXiv 2302.01318, Theorem 1). By induction from the last stage
             backwards, the emitted token ~ p, and the walk then continues from the accepted child with
             that child's p.
    typical  (Medusa) accept a child iff p(x) > min(epsilon, delta * exp(-H(p))) for its parent's p;
             longest accepted path; next token sampled from p (argmax at temperature 0). Not lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from draftheads.core.sampling import sample, top1, warp_probs
from draftheads.core.tree import Tree
from draftheads.decoding.settings import DecodeSettings, check_rule
from draftheads.decoding.tree_tensors import children_table, parent_tensor, retrieve_indices


@dataclass
class Acceptance:
    """path: [b, D+1] accepted node indices, root first, padded with -1.
    num_accepted: [b] accepted drafts (path length - 1). next_token: [b] the new pending token."""

    path: torch.Tensor
    num_accepted: torch.Tensor
    next_token: torch.Tensor


def accept(
    rule: str,
    tree: Tree,
    tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    *,
    epsilon: float = DecodeSettings.typical_epsilon,
    delta: float = DecodeSettings.typical_delta,
    warp: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Acceptance:
    """Run the rule named `rule` (a key of RULES). warp: p is raw logits, and the rule warps only the nodes it
    reads (strict reads depth + 1 of a tree's N nodes); the other rules warp all of them first."""
    if warp is not None and rule == "strict":
        return accept_strict(tree, tokens, p, q, generator, warp=warp)
    if warp is not None:
        p = warp(p)
    return RULES[check_rule(rule)](tree, tokens, p, q, generator, epsilon, delta)


def target_warp(settings: DecodeSettings) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How the target's logits become the p that `settings`' rule reads: warped by temperature, top-k and top-p
    exactly as plain sampling does; None for the greedy rule, which reads only the argmax that all three keep
    (warping [N, V] for it would add to every verify step)."""
    if settings.applied_rule == "greedy":
        return None
    return lambda logits: warp_probs(logits, settings.temperature, settings.top_k, settings.top_p)


def parent_values(tree: Tree, tokens: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[b, N]: p of each node's parent at the node's token (root: 1)."""
    parents = parent_tensor(tree).to(tokens.device).clamp(min=0)
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    out = p[rows, parents[None, :], tokens]
    out[:, 0] = 1.0
    return out


def longest_path(tree: Tree, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ok: [b, N] per-node pass/fail -> (path [b, D+1] padded -1, num_accepted [b]) of the longest
    all-pass root path; ties go to the first leaf in node order (lower sibling ranks)."""
    paths = retrieve_indices(tree).to(ok.device)                      # [L, D+1]
    passed = ok[:, paths.clamp(min=0)] & (paths >= 0)                # [b, L, D+1]
    passed[:, :, 0] = True
    lengths = passed.long().cumprod(-1).sum(-1)                      # [b, L] nodes on the path, root included
    best = lengths.argmax(-1)                                         # first maximum
    length = lengths.gather(1, best[:, None])[:, 0]
    path = paths[best]                                                # [b, D+1]
    depth = torch.arange(path.shape[1], device=ok.device)
    path = path.masked_fill(depth[None, :] >= length[:, None], -1)
    return path, length - 1


def last_node(path: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """[b] the deepest accepted node."""
    return path.gather(1, num_accepted[:, None])[:, 0]


def accept_greedy(tree: Tree, tokens: torch.Tensor, p: torch.Tensor) -> Acceptance:
    argmax = top1(p)                                                  # [b, N]
    parents = parent_tensor(tree).to(tokens.device).clamp(min=0)
    ok = tokens == argmax[:, parents]
    path, n = longest_path(tree, ok)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return Acceptance(path, n, argmax[rows, last_node(path, n)])


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """[..., V] -> [...] min(epsilon, delta * exp(-H(p))), H in nats."""
    entropy = torch.special.entr(p).sum(-1)
    return torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))


def accept_typical(tree: Tree, tokens: torch.Tensor, p: torch.Tensor, generator=None, *,
                   epsilon: float = DecodeSettings.typical_epsilon,
                   delta: float = DecodeSettings.typical_delta) -> Acceptance:
    parents = parent_tensor(tree).to(tokens.device).clamp(min=0)
    threshold = typical_threshold(p, epsilon, delta)                  # [b, N]
    ok = parent_values(tree, tokens, p) > threshold[:, parents]
    path, n = longest_path(tree, ok)
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    return Acceptance(path, n, sample(p[rows, last_node(path, n)], generator))


def sibling_draft(q_left: torch.Tensor | None, x: torch.Tensor, vocab: int) -> torch.Tensor:
    """[b, V] the distribution sibling x [b] was drawn from: q over the tokens not drawn before it
    (renormalised), or a point mass on x when the children are deterministic.

    A child the draft gave no probability was not drawn from it: a drafter pads the children with such
    tokens when q underflowed to fewer tokens than the node has children (low temperatures). Its choice
    is fixed by what was drawn before, so it is a point mass too (treating it as drawn from q would
    accept it whenever the target gives it any mass)."""
    point = torch.nn.functional.one_hot(x, vocab).float()
    if q_left is None:
        return point
    drawn = q_left.gather(1, x[:, None]) > 0  # [b, 1]
    return torch.where(drawn, q_left / q_left.sum(-1, keepdim=True).clamp_min(1e-30), point)


def remove_drawn(q_left: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[b, V] q without token x [b]: the next sibling was drawn without replacement, so never x again."""
    return q_left.scatter(1, x[:, None], 0.0)


def residual(r: torch.Tensor, q_j: torch.Tensor) -> torch.Tensor:
    """norm(max(0, r - q_j)) per row [b, V]; rows whose residual vanished (r == q_j up to rounding,
    where rejection has probability ~0) keep r."""
    res = (r - q_j).clamp_min(0)
    total = res.sum(-1, keepdim=True)
    return torch.where(total > 1e-9, res / total.clamp_min(1e-30), r)


def accept_strict(
    tree: Tree, tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None = None, generator=None, warp=None
) -> Acceptance:
    """warp: p holds logits and each node's distribution is warp(logits) when the walk reaches it."""
    b, _, vocab = p.shape
    device = tokens.device
    rows = torch.arange(b, device=device)
    children = children_table(tree).to(device)                        # [N, W]
    path = torch.full((b, tree.depth + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    node = torch.zeros(b, dtype=torch.long, device=device)
    walking = torch.ones(b, dtype=torch.bool, device=device)
    next_token = torch.zeros(b, dtype=torch.long, device=device)
    for depth in range(tree.depth + 1):
        r = (p[rows, node] if warp is None else warp(p[rows, node])).float()
        q_left = None if q is None else q[rows, node].float()
        moved = torch.zeros_like(walking)
        for rank in range(children.shape[1]):
            child = children[node, rank]                              # [b], -1 where absent
            trying = walking & ~moved & (child >= 0)
            if not trying.any():
                break
            x = tokens[rows, child.clamp(min=0)]
            q_j = sibling_draft(q_left, x, vocab)
            ratio = r[rows, x] / q_j[rows, x].clamp_min(1e-30)
            u = torch.rand(b, generator=generator, device=device)
            ok = trying & (u < ratio)
            rejected = trying & ~ok
            r = torch.where(rejected[:, None], residual(r, q_j), r)
            if q_left is not None:
                q_left = torch.where(trying[:, None], remove_drawn(q_left, x), q_left)
            node = torch.where(ok, child, node)
            path[:, depth + 1] = torch.where(ok, child, path[:, depth + 1])
            moved |= ok
        stopping = walking & ~moved
        if stopping.any():
            next_token = torch.where(stopping, sample(r, generator), next_token)
        walking &= moved
    num_accepted = (path >= 0).sum(-1) - 1
    return Acceptance(path, num_accepted, next_token)


# name (settings.RULE_NAMES, what settings are checked against) -> rule, every rule called as (tree, tokens, p, q,
# generator, epsilon, delta)
RULES: dict[str, Callable[..., Acceptance]] = {
    "greedy": lambda tree, tokens, p, q, generator, epsilon, delta: accept_greedy(tree, tokens, p),
    "strict": lambda tree, tokens, p, q, generator, epsilon, delta: accept_strict(tree, tokens, p, q, generator),
    "typical": lambda tree, tokens, p, q, generator, epsilon, delta: accept_typical(tree, tokens, p, generator,
                                                                                     epsilon=epsilon, delta=delta),
}
