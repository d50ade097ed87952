"""train.mode: hybrid — features computed by the target the first time a row is trained on, and cached.

The first epoch runs online and writes each row's features as it goes; later epochs (and a resumed run)
read them, like offline mode, without a separate caching pass before training starts. Each row is one
file, `row_00001234.npy` ([len, F] in train.feature_dtype; bf16 as its uint16 bit pattern), written to a
`.tmp` name and renamed, so a run killed at any moment leaves only whole rows behind. The folder is keyed
like the offline cache (target weights, layers, rows), so a changed target never reads stale features.

train.feature_cache_max_gb caps the disk the cache may take: past it rows are no longer written and are
computed online every epoch. Each process writes the rows it trains on and gets an equal share of the cap.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

from draftheads.training.features import STORAGE


class HybridFeatures:
    """Row i's cached features ([len_i, F] tensor) or None; `store` writes rows computed online."""

    stores_rows = True  # batches carry their row indices (training/batches.py), so computed features can be stored

    def __init__(self, folder: Path, feature_dtype: str, dim: int, budget_bytes: float):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.torch_dtype, self.np_dtype, self.nbytes = STORAGE[feature_dtype]
        self.bf16 = feature_dtype == "bf16"
        self.dim = dim
        self.budget = budget_bytes  # what this process may still write
        self.written = 0

    def path(self, i: int) -> Path:
        return self.folder / f"row_{i:08d}.npy"

    def row(self, i: int) -> torch.Tensor | None:
        path = self.path(i)
        if not path.is_file():
            return None
        values = torch.from_numpy(np.load(path))
        return values.view(torch.bfloat16) if self.bf16 else values

    def store(self, i: int, features: torch.Tensor) -> None:
        """Cache row i's features [len, F] unless they are cached already or the cap is reached."""
        size = features.shape[0] * self.dim * self.nbytes
        path = self.path(i)
        if path.is_file() or self.written + size > self.budget:
            return
        values = features.detach().to(self.torch_dtype).cpu()
        array = (values.view(torch.int16) if self.bf16 else values).numpy().view(self.np_dtype)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
        self.written += size


def open_hybrid_cache(accelerator, folder: Path, feature_dtype: str, dim: int, tokens: int,
                      max_gb: float | None) -> HybridFeatures:
    """The cache folder, with what it will take printed before training starts."""
    folder = Path(folder)
    full = tokens * dim * STORAGE[feature_dtype][2]
    held = sum(p.stat().st_size for p in folder.glob("row_*.npy")) if folder.is_dir() else 0
    cap = full if max_gb is None else min(full, max_gb * 2**30)
    if accelerator.is_main_process:
        limit = "" if max_gb is None else f", capped at {max_gb:g} GiB: {min(1.0, cap / max(full, 1)):.0%} of the rows"
        print(f"draftheads: hybrid feature cache in {folder}: {full / 2**20:,.1f} MiB for all {tokens:,} tokens"
              f"{limit}; {held / 2**20:,.1f} MiB cached already", file=sys.stderr)
    return HybridFeatures(folder, feature_dtype, dim, max(0.0, cap - held) / accelerator.num_processes)


def store_batch(cache: HybridFeatures, batch: dict, rows: list[list[int]], features: torch.Tensor) -> None:
    """Write every row of the batch its features were just computed for (packed sequences hold several rows)."""
    for j, members in enumerate(rows):
        lengths = [int(n) for n in _row_lengths(batch, j, len(members))]
        start = 0
        for i, n in zip(members, lengths):
            cache.store(i, features[j, start:start + n])
            start += n


def _row_lengths(batch: dict, j: int, count: int) -> list[int]:
    """Lengths of the `count` rows in sequence j: one row per sequence, or packed ones (positions restart at 0)."""
    real = int(batch["attention_mask"][j].sum())
    if count == 1:
        return [real]
    starts = (batch["position_ids"][j, :real] == 0).nonzero().flatten().tolist() + [real]
    return [b - a for a, b in zip(starts, starts[1:])]
