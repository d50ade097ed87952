"""Predicted tokens per second and speedup of a drafter and tree, made before the run from a cost profile.

For a prompt of P tokens answered with N new tokens, with tau tokens per step (expected from the drafter's
acceptance, measured on other prompts) and a step of n verified nodes and depth K at mean context c:

    plain   prefill(P) + N * (forward(1, c) + rule(1))
    spec    prefill(P) + observe * P + (N / tau) * (forward(n, c) + rule(n) + draft(K, n))
    speedup plain / spec, summed over the prompts

At batch size b every row is a prompt like these, decoded together: a forward of b rows costs a one-row forward
times factor(b, n) (costmodel/batch_profile.py), while prefill, observing, drafting and the rule run row by row
(b times theirs). On a CPU factor(b, n) grows about as b * forward(n) / forward(1), so the verify's extra nodes,
almost free for one row, cost as much as they would as separate forwards and speculation stops paying.

forward, rule and draft come from costmodel/profile.py (measured on this machine, cached). Nothing in it is
read from the timings of the run it predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.costmodel.auto_tree import auto_tree, expected_accepted
from draftheads.costmodel.batch_profile import BatchProfile
from draftheads.costmodel.profile import DrafterProfile, TargetProfile


@dataclass
class StepShape:
    """What one speculative step verifies and drafts, on average."""

    tau: float       # tokens emitted per step, bonus included
    nodes: float     # nodes verified per step, root included
    depth: float     # draft levels per step


def predict(target: TargetProfile, drafter: DrafterProfile | None, shape: StepShape, prompt_lengths: list[int],
            new_tokens: int, rule: str, plain_rule: str = "greedy", draft_steps: float | None = None,
            observe_steps: float | None = None, batch: BatchProfile | None = None, rows: int = 1) -> dict:
    """{'plain_s', 'spec_s', 'tokens_per_s_plain', 'tokens_per_s_spec', 'speedup', 'verify_cost', 'draft_cost'}
    for generating `new_tokens` after each prompt. Draft costs are in plain decode steps (timed beside one, so
    they keep when the machine's speed drifts): draft_steps per step and observe_steps per prompt token for exactly
    this drafter and tree, else the drafter profile's fit. rows > 1: every prompt decoded in a batch of that many
    (costs per row; `batch` gives what a forward of the batch costs)."""
    if rows > 1 and batch is None:
        raise DraftheadsError("a prediction at batch size > 1 needs the target's batch profile")
    scale = batch.factor if rows > 1 else (lambda _rows, _queries: 1.0)
    if draft_steps is None and drafter is not None:
        draft_steps = drafter.step_in_decode_steps(shape.depth, shape.nodes)
        observe_steps = drafter.observe_s / drafter.plain_step_s
    plain = spec = step_plain_sum = verify_sum = draft_sum = 0.0
    for length in prompt_lengths:
        context = length + new_tokens / 2
        one_row_step = target.decode_step(context) + target.rule(plain_rule, 1)
        step_plain = target.decode_step(context) * scale(rows, 1) / rows + target.rule(plain_rule, 1)
        verify = target.forward(shape.nodes, context) * scale(rows, shape.nodes) / rows + target.rule(rule, shape.nodes)
        draft = (draft_steps or 0.0) * one_row_step     # per row: each row drafts on its own
        observe = (observe_steps or 0.0) * one_row_step * length
        prefill = target.prefill(length)
        plain += prefill + new_tokens * step_plain
        spec += prefill + observe + new_tokens / max(shape.tau, 1e-9) * (verify + draft)
        step_plain_sum, verify_sum, draft_sum = step_plain_sum + step_plain, verify_sum + verify, draft_sum + draft
    total = new_tokens * len(prompt_lengths)
    return {"plain_s": plain, "spec_s": spec, "tokens_per_s_plain": total / plain, "tokens_per_s_spec": total / spec,
            "speedup": plain / spec, "tau": shape.tau, "nodes": shape.nodes,
            "verify_cost": verify_sum / step_plain_sum, "draft_cost": draft_sum / step_plain_sum}


def fastest_tree(target: TargetProfile, drafter: DrafterProfile, accuracy, prompt_lengths: list[int], new_tokens: int,
                 rule: str = "greedy", max_budget: int = 64) -> tuple[Tree, dict]:
    """The static tree (auto_tree of every node budget up to max_budget) with the highest predicted tokens/s under
    the independence model of the per-depth, per-rank accuracy table, and its prediction."""
    best = None
    seen = set()
    for budget in range(1, max_budget + 1):
        try:
            tree = auto_tree(accuracy, budget)
        except DraftheadsError:   # an all-zero table: nothing to draft
            break
        if tree.paths in seen:
            continue
        seen.add(tree.paths)
        shape = StepShape(1 + expected_accepted(tree, accuracy), tree.num_nodes, tree.depth)
        figures = predict(target, drafter, shape, prompt_lengths, new_tokens, rule)
        if best is None or figures["tokens_per_s_spec"] > best[1]["tokens_per_s_spec"]:
            best = (tree, figures)
    if best is None:
        return Tree.chain(1), predict(target, drafter, StepShape(1.0, 2, 1), prompt_lengths, new_tokens, rule)
    return best
