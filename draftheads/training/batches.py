"""Training rows and batches: the eval split, length-bucketed or packed batch order, collation.

Rows come from the target-generated dataset (`draftheads data`): input_ids, loss_mask, prompt_id.
Every batch holds whole rows padded on the right, so rows never attend to each other; or, with
train.pack, sequences of several whole rows each (first-fit-decreasing into max_length tokens), whose
position_ids restart at 0 for every row: the target (transformers' packed-sequence masks) and every
drafter then keep each row to itself, and no prediction crosses into the next row.
Batch order is a pure function of (seed, epoch), which makes the data position resumable
as (epoch, batches consumed) without replaying anything.
"""

from __future__ import annotations

import numpy as np
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.data.datastore import COLUMNS

NO_ANSWER = np.iinfo(np.int64).max  # first_answers of a row without an answer token


def row_lengths(rows, max_length: int) -> np.ndarray:
    """Token count of every row after truncation to max_length, [n]."""
    lengths = np.fromiter((len(ids) for ids in rows.with_format(None)["input_ids"]), dtype=np.int64, count=len(rows))
    return np.minimum(lengths, max_length)


def first_answers(rows) -> np.ndarray:
    """[n] the position of each row's first answer token a drafter can learn (loss-masked, after position 0, which
    nothing comes before); NO_ANSWER for a row without one. Cut to max_length, a row keeps one iff this < max_length."""
    first = np.full(len(rows), NO_ANSWER, dtype=np.int64)
    for start in range(0, len(rows), 1024):
        for j, mask in enumerate(rows[start : start + 1024]["loss_mask"]):
            hits = np.flatnonzero(np.asarray(mask)[1:])
            if len(hits):
                first[start + j] = hits[0] + 1
    return first


def answered_rows(rows, max_length: int, setting: str, note, what: str = "rows") -> np.ndarray:
    """The indices of the rows with an answer token left once cut to `max_length` (named `setting`, the rows `what`,
    in messages). A row without one adds no loss, and a batch of only such rows leaves nothing to backpropagate: they
    are left out with a `note`, and refused in one line when no row is left."""
    first = first_answers(rows)
    kept = np.flatnonzero(first < max_length)
    if len(kept) == 0 and first.min() == NO_ANSWER:
        raise DraftheadsError(f"none of the {len(rows)} {what} has an answer token after its first token; "
                              "regenerate the data with `draftheads data`, whose rows mark the target's answers")
    if len(kept) == 0:
        earliest = int(first.min())
        raise DraftheadsError(f"{setting}={max_length} leaves no answer token in any of the {len(rows)} {what} (the "
                              f"earliest answer starts at token {earliest}); raise {setting} above {earliest}")
    if len(kept) < len(rows):
        note(f"draftheads: {len(rows) - len(kept)} of {len(rows)} rows keep no answer token within "
             f"{setting}={max_length} and are left out; raise {setting} to keep them")
    return kept


def split_rows(n: int, eval_fraction: float, seed: int, groups: np.ndarray | None = None,
               ) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, eval indices): a seeded random hold-out of round(n * eval_fraction) rows, at least 1 if asked
    for. With `groups` (each row's prompt_id), rows of one prompt stay on one side: a prompt answered twice
    (data.samples_per_prompt) or re-rendered turn by turn shares most of its tokens between its rows, so one of them
    held out beside a trained sibling would measure recall, not drafting. Whole prompts are held out, in the order
    their first row comes in the same permutation, until the hold-out has its row count; with one row per prompt
    that is exactly the split without groups."""
    order = np.random.default_rng(seed).permutation(n)
    n_eval = int(round(n * eval_fraction))
    if eval_fraction > 0:
        n_eval = min(max(n_eval, 1), n - 1)
    if n - n_eval < 1:
        raise DraftheadsError(f"the dataset has {n} row(s): too few to train on; generate more data")
    if groups is None or n_eval == 0:
        return np.sort(order[n_eval:]), np.sort(order[:n_eval])
    in_order = groups[order]
    _, first = np.unique(in_order, return_index=True)
    prompts = in_order[np.sort(first)]  # prompts by their first row's place in the permutation
    ids, rows_per_prompt = np.unique(groups, return_counts=True)
    rows_held = np.cumsum(rows_per_prompt[np.searchsorted(ids, prompts)])  # after holding out prompts[:i + 1]
    held_prompts = prompts[: int(np.searchsorted(rows_held, n_eval)) + 1]
    held = np.isin(groups, held_prompts)
    if held.all():
        raise DraftheadsError(f"the dataset has {n} rows from {len(prompts)} prompt(s): too few to hold whole prompts "
                              "out and train on the rest; generate more data.num_prompts or set train.eval_fraction=0")
    return np.flatnonzero(~held), np.flatnonzero(held)


def epoch_batches(indices: np.ndarray, lengths: np.ndarray, batch_size: int, seed: int, epoch: int,
                  bucket: bool = True) -> list[list[int]]:
    """Batches of row indices for one epoch, in a (seed, epoch)-determined order.

    With bucketing, rows are shuffled, cut into pools of 64 batches, sorted by length inside each
    pool (so padding stays small) and the batches are shuffled again (so lengths do not trend).
    The last incomplete batch is dropped so every step sees batch_size rows.
    """
    rng = np.random.default_rng([seed, epoch])
    order = indices[rng.permutation(len(indices))]
    if bucket:
        pool = batch_size * 64
        order = np.concatenate([
            chunk[np.argsort(-lengths[chunk], kind="stable")]
            for chunk in np.array_split(order, max(1, -(-len(order) // pool)))
        ])
    n = len(order) // batch_size
    batches = [order[i * batch_size:(i + 1) * batch_size].tolist() for i in range(n)]
    return [batches[i] for i in rng.permutation(n)] if bucket else batches


def epoch_packs(indices: np.ndarray, lengths: np.ndarray, batch_size: int, capacity: int, seed: int,
                epoch: int) -> list[list[tuple[int, ...]]]:
    """Batches of `batch_size` packed sequences (tuples of row indices, <= capacity tokens each) for one epoch.

    Rows are shuffled, cut into pools, and each pool is packed first-fit-decreasing (longest rows first, each
    into the first sequence with room): pools keep the packing work small and mix lengths across the epoch.
    The batches are shuffled again; an incomplete last batch is dropped.
    """
    rng = np.random.default_rng([seed, epoch])
    order = indices[rng.permutation(len(indices))]
    packs = []
    for chunk in np.array_split(order, max(1, -(-len(order) // 1024))):
        packs.extend(first_fit_decreasing(chunk, lengths, capacity))
    packs = [packs[i] for i in rng.permutation(len(packs))]
    n = len(packs) // batch_size
    return [packs[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def first_fit_decreasing(rows: np.ndarray, lengths: np.ndarray, capacity: int) -> list[tuple[int, ...]]:
    """Rows into sequences of at most `capacity` tokens: longest first, each into the first with room."""
    packs, room = [], []
    for i in rows[np.argsort(-lengths[rows], kind="stable")]:
        n = int(lengths[i])
        place = next((k for k, free in enumerate(room) if free >= n), None)
        if place is None:
            packs.append([])
            room.append(capacity)
            place = len(packs) - 1
        packs[place].append(int(i))
        room[place] -= n
    return [tuple(p) for p in packs]


def shard(batches: list, rank: int, world: int) -> list:
    """This process's share: every world-th batch, trimmed so all processes get the same count."""
    n = len(batches) // world
    return batches[rank::world][:n]


def eval_batches(indices: np.ndarray, lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """All eval rows (none dropped), longest first, in fixed batches."""
    order = indices[np.argsort(-lengths[indices], kind="stable")]
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]


class RowSet(torch.utils.data.Dataset):
    """Row i of the dataset as tensors, truncated to max_length; with a feature cache, its features too."""

    def __init__(self, rows, max_length: int, features=None):
        self.rows, self.max_length, self.features = rows, max_length, features

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i) -> dict:
        if isinstance(i, tuple):  # a packed sequence
            return pack([self[j] for j in i])
        row = self.rows[int(i)]
        item = {
            "input_ids": torch.as_tensor(np.asarray(row["input_ids"])[: self.max_length], dtype=torch.long),
            "loss_mask": torch.as_tensor(np.asarray(row["loss_mask"])[: self.max_length], dtype=torch.long),
        }
        if self.features is not None:
            features = self.features.row(int(i))
            if features is not None:  # a hybrid cache (training/hybrid_cache.py) misses rows not trained on yet
                item["features"] = features
            if getattr(self.features, "stores_rows", False):
                item["rows"] = [int(i)]  # which rows to cache once the target has computed their features
        return item


def pack(items: list[dict]) -> dict:
    """Rows one after another as one sequence, with position_ids restarting at 0 for each."""
    out = {key: torch.cat([it[key] for it in items]) for key in ("input_ids", "loss_mask")}
    if all("features" in it for it in items):
        out["features"] = torch.cat([it["features"] for it in items])
    if "rows" in items[0]:
        out["rows"] = [i for it in items for i in it["rows"]]
    out["position_ids"] = torch.cat([torch.arange(len(it["input_ids"])) for it in items])
    return out


def collate(items: list[dict]) -> dict:
    """Right-pad a list of rows into a batch: input_ids/attention_mask/loss_mask [b, s] (features [b, s, F]).

    Packed sequences bring position_ids [b, s]; their padding counts from 0 again, a row of its own that
    nothing attends to (attention_mask 0)."""
    s = max(len(it["input_ids"]) for it in items)
    b = len(items)
    out = {
        "input_ids": torch.zeros(b, s, dtype=torch.long),
        "attention_mask": torch.zeros(b, s, dtype=torch.long),
        "loss_mask": torch.zeros(b, s, dtype=torch.long),
    }
    features = all("features" in it for it in items)  # a batch with one hybrid-cache miss is computed whole
    if features:
        f = items[0]["features"]
        out["features"] = torch.zeros(b, s, f.shape[-1], dtype=f.dtype)
    if "rows" in items[0]:
        out["rows"] = [it["rows"] for it in items]
    if "position_ids" in items[0]:
        out["position_ids"] = torch.zeros(b, s, dtype=torch.long)
    for j, it in enumerate(items):
        n = len(it["input_ids"])
        out["input_ids"][j, :n] = it["input_ids"]
        out["attention_mask"][j, :n] = 1
        out["loss_mask"][j, :n] = it["loss_mask"]
        if features:
            out["features"][j, :n] = it["features"]
        if "position_ids" in it:
            out["position_ids"][j] = torch.cat([it["position_ids"], torch.arange(s - n)])
    return out


def loss_token_counts(rows, indices: np.ndarray, max_length: int, vocab_size: int) -> torch.Tensor:
    """How often each token appears at a loss-masked position of the given rows, [V] long."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in indices:
        row = rows[int(i)]
        ids = np.asarray(row["input_ids"])[:max_length]
        mask = np.asarray(row["loss_mask"])[:max_length].astype(bool)
        counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(counts)
