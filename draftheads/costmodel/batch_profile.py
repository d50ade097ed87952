"""What a batch of rows costs a verify forward on this machine, beside one row: the factor the cost model scales a
one-row forward by (costmodel/cost_model.py) to predict speedup at batch size > 1.

A verify of b rows of n tokens each on b caches of BATCH_CONTEXT tokens is timed on a grid b x n; factor(b, n) =
time(b, n) / time(1, n), read between grid points by linear interpolation in b and n. The factor carries the
context dependence of the one-row profile over to batches: it is measured at one context only, as a batch's cost
grows with its rows far more than with their length at the contexts we evaluate. On a GPU a forward of 16 rows costs
little more than one (the factor stays near 1 and speculation keeps paying); on a CPU it costs about 16 times one,
and verifying a tree on every row soon costs more than it saves.

Cached as JSON beside the target profile (costmodel/profile.py), under the same key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftheads.core.target_dims import context_limit
from draftheads.costmodel.profile import cached_profile, fastest_time, forward_step, interpolate, monotone
from draftheads.decoding.verify import new_cache, prefill

BATCHES = (1, 2, 4, 8, 16)
BATCH_QUERIES = (1, 2, 4, 8, 16, 32)
BATCH_CONTEXT = 256
BATCH_REPEATS = 5


@dataclass
class BatchProfile:
    """forward_s[i][j]: seconds of a verify forward of batches[i] rows x queries[j] tokens on BATCH_CONTEXT each."""

    key: dict
    batches: list[int]
    queries: list[int]
    forward_s: list[list[float]]
    created: str = ""

    def factor(self, rows: float, queries: float) -> float:
        """A verify of `rows` rows over one row's, at `queries` tokens per row."""
        if rows <= 1:
            return 1.0
        at = [interpolate(self.queries, row, queries) for row in self.forward_s]
        return interpolate(self.batches, at, rows) / at[0]


@torch.no_grad()
def measure_batch_forwards(model, batches=BATCHES, queries=BATCH_QUERIES, repeats: int = BATCH_REPEATS,
                           context: int = BATCH_CONTEXT) -> list[list[float]]:
    """forward_s as BatchProfile defines it: verify + greedy pick + the caches cut back, the fastest of `repeats`
    runs after two untimed ones, each row made monotone in the tokens."""
    device = model.device
    context = min(context, context_limit(model) - max(queries) - 1)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(0)
    grid = []
    for rows in batches:
        cache = new_cache(model)
        prefill(model, torch.randint(vocab, (rows, context), generator=generator).to(device), cache)
        cells = []
        for n in queries:
            step = forward_step(model, cache, context, torch.randint(vocab, (rows, n), generator=generator).to(device))
            step()
            step()
            cells.append(fastest_time(step, device, repeats))
        grid.append(monotone(cells))
    return grid


def batch_profile(model, *, refresh: bool = False, progress=print) -> BatchProfile:
    """The cached batch profile of this target on this machine (measured now if absent or `refresh`)."""
    saved, _ = cached_profile("batch", model, lambda: {"batches": list(BATCHES), "queries": list(BATCH_QUERIES),
                                                       "forward_s": measure_batch_forwards(model)},
                              "forwards by batch size", "batches", refresh, progress)
    return BatchProfile(**saved)
