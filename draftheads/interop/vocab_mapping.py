"""Draft-vocabulary mappings as other tools store them, so a vocabulary chosen once is reused across runs and tools.

    ids = read_vocab_mapping("vocab_mapping.pt", vocab_size)   # the draft vocabulary's target ids, ascending
    write_vocab_mappings(folder, d2t, vocab_size)              # vocab_mapping.pt, d2t.npy, t2d.npy

Forms read (all hold d2t, the offsets with target id = draft index + d2t[draft index], the layout EAGLE-3 engines
read; t2d, where present, must agree):
- SpecForge's `vocab_mapping_path`: a torch file of {"d2t": [Vd] int, "t2d": [V] bool}, read with weights_only
  (plain tensors; no pickled code runs);
- speculators' `--d2t-path` / `--t2d-path`: `d2t.npy` (t2d.npy beside it is checked when present), read without
  pickle;
- ours: a draftheads drafter folder, a run folder, or any safetensors file holding d2t.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from draftheads.core.errors import DraftheadsError
from draftheads.heads.parts import draft_vocab
from draftheads.interop.native import WEIGHTS, resolve_drafter_folder

SPECFORGE_FILE, D2T_FILE, T2D_FILE = "vocab_mapping.pt", "d2t.npy", "t2d.npy"


def read_vocab_mapping(path: str, vocab_size: int) -> torch.Tensor:
    """[Vd] the target ids of the draft vocabulary stored at `path`, ascending; one-line errors for what is wrong."""
    where = Path(path).expanduser()
    if not where.exists():
        raise DraftheadsError(f"draft vocabulary '{path}' not found; give a SpecForge vocab_mapping .pt, a speculators "
                              "d2t.npy, or a draftheads drafter folder")
    d2t, t2d = _read(where)
    if d2t.ndim != 1 or d2t.dtype.is_floating_point or not len(d2t):
        raise DraftheadsError(f"draft vocabulary '{path}': d2t must be a 1-d integer tensor, got {tuple(d2t.shape)} "
                              f"{d2t.dtype}")
    ids = draft_vocab.ids(d2t.long())
    if ids.min() < 0 or ids.max() >= vocab_size or len(ids.unique()) != len(ids):
        raise DraftheadsError(f"draft vocabulary '{path}' maps to token ids outside this target's vocabulary of "
                              f"{vocab_size} (or repeats one); it was made for another target")
    if t2d is not None and not torch.equal(t2d.bool().flatten(), draft_vocab.members(d2t.long(), vocab_size)):
        raise DraftheadsError(f"draft vocabulary '{path}': its t2d does not mark the tokens its d2t maps to (or has "
                              "another vocabulary size); the two files come from different runs")
    return ids.sort().values


def _read(where: Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    if where.is_dir():   # a drafter or run folder of ours
        where = resolve_drafter_folder(where) / WEIGHTS
    if where.suffix == ".safetensors":
        tensors = load_file(str(where))
        if "d2t" not in tensors:
            raise DraftheadsError(f"'{where}' holds no d2t: that drafter drafts over the full vocabulary")
        return tensors["d2t"], tensors.get("t2d")
    if where.suffix == ".npy":
        d2t = torch.from_numpy(_npy(where))
        t2d_file = where.with_name(T2D_FILE)
        return d2t, torch.from_numpy(_npy(t2d_file)) if t2d_file.is_file() and where.name == D2T_FILE else None
    try:
        saved = torch.load(where, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a bad or unsafe pickle
        raise DraftheadsError(f"cannot read '{where}' as plain tensors ({type(e).__name__}); give SpecForge's "
                              "vocab_mapping .pt ({{d2t, t2d}}) or speculators' d2t.npy") from None
    if not isinstance(saved, dict) or "d2t" not in saved:
        raise DraftheadsError(f"'{where}' has no 'd2t' entry; give SpecForge's vocab_mapping .pt ({{d2t, t2d}})")
    return torch.as_tensor(saved["d2t"]), (torch.as_tensor(saved["t2d"]) if "t2d" in saved else None)


def _npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DraftheadsError(f"cannot read '{path}' as a numpy array ({str(e).splitlines()[0][:120]})") from None


def write_vocab_mappings(folder: Path, d2t: torch.Tensor, vocab_size: int) -> list[str]:
    """The draft vocabulary in SpecForge's and speculators' forms, into `folder`; returns the file names."""
    d2t = d2t.detach().cpu().long()
    t2d = draft_vocab.members(d2t, vocab_size)
    torch.save({"d2t": d2t, "t2d": t2d}, folder / SPECFORGE_FILE)
    np.save(folder / D2T_FILE, d2t.numpy())
    np.save(folder / T2D_FILE, t2d.numpy())
    return [SPECFORGE_FILE, D2T_FILE, T2D_FILE]
