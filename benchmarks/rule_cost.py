"""What the acceptance rules cost per step on SmolLM2's vocabulary (49,152 tokens), a 25-node tree, bf16 logits.

    .venv/bin/python -m benchmarks.rule_cost

Prints milliseconds per step (median of 30) for greedy, strict warping every node first (how the loop ran
before), strict warping only the nodes its walk reaches (how it runs now), and typical, at T = 0.7 and 1.0, with
and without top-p 0.9. Run it with nothing else heavy on the machine.
"""

from __future__ import annotations

import statistics
import time

import torch

from draftheads.core.sampling import warp_probs
from draftheads.core.tree import Tree
from draftheads.decoding.accept import accept

VOCAB, REPEATS = 49152, 30


def median_ms(run) -> float:
    run()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    tree = Tree.from_paths([(0,) * d + (r,) for d in range(5) for r in range(5)][:24])   # 25 nodes, depth 5
    logits = (3 * torch.randn(1, tree.num_nodes, VOCAB)).to(torch.bfloat16)
    tokens = torch.randint(VOCAB, (1, tree.num_nodes))
    q = torch.softmax(torch.randn(1, tree.num_nodes, VOCAB), -1)
    generator = torch.Generator().manual_seed(0)
    for temperature, top_p in ((0.7, 1.0), (0.7, 0.9), (1.0, 1.0), (1.0, 0.9)):
        def warp(x, temperature=temperature, top_p=top_p):
            return warp_probs(x, temperature, 0, top_p)

        figures = {
            "greedy": median_ms(lambda: accept("greedy", tree, tokens, logits)),
            "strict, warping every node": median_ms(lambda: accept("strict", tree, tokens, warp(logits), q, generator)),
            "strict, warping the walked nodes": median_ms(lambda: accept("strict", tree, tokens, logits, q, generator,
                                                                         warp=warp)),
            "typical": median_ms(lambda: accept("typical", tree, tokens, logits, None, generator, warp=warp)),
        }
        print(f"T={temperature} top_p={top_p}: " + " | ".join(f"{name} {ms:.2f} ms" for name, ms in figures.items()),
              flush=True)


if __name__ == "__main__":
    main()
