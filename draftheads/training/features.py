"""The target's features: computed per batch (online) or once into an on-disk cache (offline).

Features of a row are the target's hidden states at the drafter's `feature_layers` (and, for Gemma 4's assistant
drafters, the keys and values its last layers store), concatenated on the last axis: [s, F], F = hidden_size *
len(feature_layers) for hidden states alone.

Cache layout (one folder per target/data/layers/dtype combination):
  shard_00000.npy ...  [tokens of rows a..b, F] each, rows in dataset order (numpy, memory-mapped on read;
                       bf16 is stored as its uint16 bit pattern since numpy has no bf16)
  manifest.json        written last: the cache is complete only when it exists
Shards are written to `*.tmp` and renamed, so an interrupted build resumes at the first missing shard.

The manifest also records the settings the values depend on besides the rows (`settings_key`) and a
digest of the token ids of each shard's rows. A new cache in the same folder of caches (a data
folder's features/) takes every shard whose rows an earlier cache with the same settings already
holds, and then removes those earlier caches: they were built for rows the data folder no longer
has. So after `draftheads data` grows a folder (its old rows first), only the new rows' shards are
computed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from draftheads.core.errors import DraftheadsError
from draftheads.core.state_files import DamagedFile, read_json
from draftheads.core.target_family import reads_kv
from draftheads.decoding.verify import feature_outputs, gather_features
from draftheads.training.batches import collate
from draftheads.training.sharding import is_sharded

SHARD_ROWS = 512
MANIFEST_KEYS = ("feature_dtype", "shard_rows", "shards", "dim", "lengths")   # what FeatureCache reads of it
STORAGE = {  # feature_dtype -> (torch dtype, numpy storage dtype, bytes per value)
    "bf16": (torch.bfloat16, np.uint16, 2),
    "fp16": (torch.float16, np.float16, 2),
    "fp32": (torch.float32, np.float32, 4),
}


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The features `layers` name (decoding/verify.gather_features: hidden states, -1 = after the final norm, and
    stored keys and values), [b, s, F].

    Runs the base model only: the lm_head over the whole vocabulary is not needed here. Packed rows come
    with position_ids [b, s] restarting at 0 for each row and no attention mask: transformers then builds
    a mask that keeps every row to itself (its packed-sequence masks).
    """
    base = getattr(target, "base_model", target)
    if position_ids is not None:
        attention_mask = None
    out = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
               **feature_outputs(layers))
    return gather_features(out, layers)


def feature_dim(target, layers) -> int:
    """F of `layers`' features: hidden_size each, and what one position of a stored-keys feature takes (read off a
    one-token forward, since the heads and sizes of such a layer are the family's business)."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    if not reads_kv(layers):
        return config.hidden_size * len(layers)
    one = torch.zeros(1, 1, dtype=torch.long, device=next(target.parameters()).device)
    return int(target_features(target, one, torch.ones_like(one), layers).shape[-1])


def _settings(target, layers, max_length: int, feature_dtype: str) -> dict:
    """What the cached values depend on besides the rows (including a fingerprint of the weights)."""
    weights = target.get_input_embeddings().weight
    # every weight counts: a LoRA update merged into a target saved over the old folder keeps its name and its
    # embeddings, and must still not be served the old target's features (sums in float64, without a float64 copy)
    probe = [float(weights.sum(dtype=torch.float64)), float(sum(float(whole(p).sum(dtype=torch.float64))
                                                                for p in target.parameters()))]
    return {
        "target": getattr(target, "name_or_path", ""), "config": target.config.to_json_string(use_diff=False),
        "dtype": str(next(target.parameters()).dtype), "probe": probe, "layers": list(layers),
        "max_length": max_length, "feature_dtype": feature_dtype,
    }


def whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter whole: a sharded target's is gathered (every process must call this), so its cache key is the
    unsharded target's."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _short_hash(info: dict) -> str:
    return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:16]


def settings_key(target, layers, max_length: int, feature_dtype: str) -> str:
    """A short hash of what the cached values depend on besides the rows."""
    return _short_hash(_settings(target, layers, max_length, feature_dtype))


def shard_digests(rowset, count: int) -> list[str]:
    """Per shard, a digest of its rows' token ids as cached (truncated to the row set's max_length)."""
    digests = []
    for start in range(0, count, SHARD_ROWS):
        h = hashlib.sha256()
        for i in range(start, min(start + SHARD_ROWS, count)):
            ids = rowset[i]["input_ids"].numpy().astype(np.int64)
            h.update(np.int64(len(ids)).tobytes())
            h.update(ids.tobytes())
        digests.append(h.hexdigest()[:16])
    return digests


def cache_key(target, layers, max_length: int, feature_dtype: str, rows, lengths: np.ndarray) -> str:
    """A short hash of everything the cached values depend on: the settings and the rows."""
    return _short_hash({**_settings(target, layers, max_length, feature_dtype), "rows": len(rows),
                        "data": getattr(rows, "_fingerprint", ""), "tokens": int(lengths.sum())})


class FeatureCache:
    """Read-only access to a complete cache: `row(i)` -> [len_i, F] tensor in the cached dtype."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        manifest = read_json(self.folder / "manifest.json", "feature cache manifest", f"delete {self.folder} and "
                             "train again to rebuild it", required=MANIFEST_KEYS)
        self.dtype_name = manifest["feature_dtype"]
        self.shard_rows = manifest["shard_rows"]
        self.lengths = np.asarray(manifest["lengths"], dtype=np.int64)
        self.dim = manifest["dim"]
        self._starts = [_shard_offsets(self.lengths, s, self.shard_rows) for s in range(manifest["shards"])]
        self._arrays: dict[int, np.ndarray] = {}
        for s in range(manifest["shards"]):  # a shard cut short or replaced would be read as garbage, or fail mid-run
            self._check_shard(s)

    def _check_shard(self, s: int) -> None:
        path = self.folder / shard_name(s)
        rows = int(self.lengths[s * self.shard_rows : (s + 1) * self.shard_rows].sum())
        try:
            shape = np.load(path, mmap_mode="r").shape
        except (OSError, ValueError) as e:
            shape = f"unreadable: {str(e).splitlines()[0][:80]}"
        if shape != (rows, self.dim):
            raise DraftheadsError(f"feature cache {self.folder} is damaged ({path.name}: {shape}, expected ({rows}, "
                                  f"{self.dim})); delete {self.folder} and train again to rebuild it")

    def row(self, i: int) -> torch.Tensor:
        s = i // self.shard_rows
        if s not in self._arrays:
            self._arrays[s] = np.load(self.folder / shard_name(s), mmap_mode="r")
        start = self._starts[s][i - s * self.shard_rows]
        values = torch.from_numpy(np.array(self._arrays[s][start:start + self.lengths[i]]))
        return values.view(torch.bfloat16) if self.dtype_name == "bf16" else values


def shard_name(s: int) -> str:
    return f"shard_{s:05d}.npy"


def _shard_offsets(lengths: np.ndarray, s: int, shard_rows: int) -> np.ndarray:
    """Start of each row of shard s inside that shard's array."""
    own = lengths[s * shard_rows:(s + 1) * shard_rows]
    return np.concatenate([[0], np.cumsum(own)[:-1]]).astype(np.int64)


def build_feature_cache(accelerator, target, rowset, lengths: np.ndarray, layers, folder: Path,
                        feature_dtype: str, batch_size: int, share_folder: bool = False,
                        keep_earlier: bool = False) -> FeatureCache:
    """Compute every row's features once (shards split over processes) unless the cache is already complete.

    `share_folder`: folder's parent holds only caches of one data folder (its features/), so shards of
    earlier caches with the same settings are taken over and those caches removed once this one is complete
    (kept with `keep_earlier`: this cache adds other folders' rows, and the data folder alone still has its own).
    """
    folder = Path(folder)
    if (folder / "manifest.json").is_file():
        return FeatureCache(folder)
    torch_dtype, np_dtype, nbytes = STORAGE[feature_dtype]
    dim = feature_dim(target, layers)
    shards = -(-len(lengths) // SHARD_ROWS)
    # every process: a sharded target's weights can only be summed by all of them together
    settings = settings_key(target, layers, rowset.max_length, feature_dtype)
    if accelerator.is_main_process:  # only the main process takes shards over and writes the manifest
        digests = shard_digests(rowset, len(lengths))
        folder.mkdir(parents=True, exist_ok=True)
        if share_folder:
            taken = _take_shards(folder, settings, digests)
            if taken:
                print(f"draftheads: {taken} of {shards} feature shards taken from an earlier cache of the same rows",
                      file=sys.stderr)
        total = int(lengths.sum()) * dim * nbytes
        _check_disk(folder, total)
        print(f"draftheads: caching target features for {int(lengths.sum()):,} tokens x {dim} ({feature_dtype}) "
              f"= {total / 2**20:,.1f} MiB ({dim * nbytes * 1000 / 2**20:.2f} MiB per 1k tokens) in {folder}",
              file=sys.stderr)
    accelerator.wait_for_everyone()
    mine = [s for s in range(accelerator.process_index, shards, accelerator.num_processes)
            if not (folder / shard_name(s)).is_file()]
    spare = _spare_forwards(accelerator, target, mine, len(lengths), batch_size)
    bar = _progress(accelerator, len(mine))
    for s in mine:
        _write_shard(target, rowset, lengths, layers, folder, s, torch_dtype, np_dtype, dim, batch_size,
                     accelerator.device)
        bar.update(1)
    bar.close()
    for _ in range(spare):
        one = torch.ones(1, 1, dtype=torch.long, device=accelerator.device)
        target_features(target, one, one, layers)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        manifest = {"feature_dtype": feature_dtype, "shard_rows": SHARD_ROWS, "shards": shards, "dim": dim,
                    "layers": list(layers), "lengths": lengths.tolist(), "settings": settings, "shard_digests": digests}
        tmp = folder / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, folder / "manifest.json")
        if share_folder and not keep_earlier:
            for old in _earlier_caches(folder, settings):
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return FeatureCache(folder)


def _spare_forwards(accelerator, target, mine: list[int], rows: int, batch_size: int) -> int:
    """Forwards this process must run after its own shards so that all run as many: each forward of a sharded
    target is a collective. Agreed on before any forward (the agreement is a collective too). 0 when not sharded."""
    if not is_sharded(target):
        return 0
    forwards = sum(-(-(min((s + 1) * SHARD_ROWS, rows) - s * SHARD_ROWS) // batch_size) for s in mine)
    most = int(accelerator.reduce(torch.tensor(forwards, device=accelerator.device), reduction="max"))
    return most - forwards


def _earlier_caches(folder: Path, settings: str) -> dict[Path, dict]:
    """Complete caches beside `folder` built with the same settings (hence for other rows) -> their manifests."""
    found = {}
    for other in sorted(folder.parent.iterdir()):
        path = other / "manifest.json"
        if other != folder and path.is_file():
            try:
                manifest = read_json(path, "feature cache manifest", "its shards are not taken over (delete "
                                     f"{other} to stop this note)")
            except DamagedFile as e:   # another cache: not ours to remove or write over, and this one can do without
                print(f"draftheads: {e}", file=sys.stderr)
                continue
            if manifest.get("settings") == settings:
                found[other] = manifest
    return found


def _take_shards(folder: Path, settings: str, digests: list[str]) -> int:
    """Hard-link (or copy) each missing shard whose rows an earlier cache holds; returns how many."""
    held = {}
    for other, manifest in _earlier_caches(folder, settings).items():
        if manifest["shard_rows"] == SHARD_ROWS:
            held.update({d: other / shard_name(s) for s, d in enumerate(manifest.get("shard_digests", []))})
    taken = 0
    for s, digest in enumerate(digests):
        dest, source = folder / shard_name(s), held.get(digest)
        if dest.is_file() or source is None or not source.is_file():
            continue
        tmp = folder / (shard_name(s) + ".tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or no hard links there
            shutil.copyfile(source, tmp)
        os.replace(tmp, dest)
        taken += 1
    return taken


def _write_shard(target, rowset, lengths, layers, folder, s, torch_dtype, np_dtype, dim, batch_size, device) -> None:
    rows = np.arange(s * SHARD_ROWS, min((s + 1) * SHARD_ROWS, len(lengths)))
    starts = _shard_offsets(lengths, s, SHARD_ROWS)
    tmp = folder / (shard_name(s) + ".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np_dtype, shape=(int(lengths[rows].sum()), dim))
    order = rows[np.argsort(-lengths[rows], kind="stable")]  # similar lengths together: little padding
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        batch = collate([rowset[int(i)] for i in idx])
        feats = target_features(target, batch["input_ids"].to(device), batch["attention_mask"].to(device), layers)
        feats = feats.to(torch_dtype).cpu()
        if torch_dtype == torch.bfloat16:
            feats = feats.view(torch.int16)
        values = feats.numpy().view(np_dtype)
        for j, i in enumerate(idx):
            start = starts[i - rows[0]]
            out[start:start + lengths[i]] = values[j, :lengths[i]]
    out.flush()
    del out
    os.replace(tmp, folder / shard_name(s))


def _check_disk(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise DraftheadsError(f"the feature cache needs {needed / 2**30:.1f} GiB but {folder} has {free / 2**30:.1f} "
                              "GiB free; free space, set train.feature_cache elsewhere, or use train.mode=online")


def _progress(accelerator, total: int):
    return tqdm(total=total, desc="features", unit="shard", disable=not accelerator.is_main_process)
