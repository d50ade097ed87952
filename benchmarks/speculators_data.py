"""Our target-generated rows as speculators' offline EAGLE-3 training data (the layout speculators 0.9.0's trainer
reads with `--data-path`, --hidden-states-backend file), computed with our own target code (imported by peers.py).

    write_speculators_data(target, rows, order, layers=(2, 15, 27), out=Path("runs/peers/speculators-data"))

    out/
        data-*.arrow, state.json ...      a `datasets` folder (torch format): input_ids [s], loss_mask [s], seq_len
        hidden_states/hs_<i>.safetensors  row i: hidden_states [s, 4, H] (the three fused layers, then the last
                                          layer's output BEFORE the final norm), token_ids [s]

Read in speculators by train/data.py ArrowDataset (file index = row index) and hs_connectors' FileTransfer; it feeds
hidden_states[:, :-1] to fc and normalises hidden_states[:, -1] with the verifier's own final norm before its lm_head
(verifier_norm, verifier_lm_head). Our offline cache keeps the last layer AFTER the final norm (hidden_states[-1] of
transformers): written as it is, speculators would normalise it twice. The three fused ones are the same values our
cache holds (training/features.py target_features, the same layers and dtype).
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import torch
from safetensors.torch import save_file

from draftheads.data.datastore import quiet_datasets
from draftheads.training.batches import collate
from draftheads.training.features import target_features


def write_speculators_data(target, rows, order, layers, out: Path, max_length: int = 512, batch_size: int = 8,
                           dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `rows` (a `draftheads data` dataset, as load_rows reads it) in the order `order` (file index i = row
    order[i]) to `out`, each cut to max_length tokens; `layers`: the three fused hidden_states indices."""
    out = Path(out)
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    items = [row_item(rows[int(r)], max_length) for r in order]
    by_length = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]))  # little padding per batch
    for start in range(0, len(by_length), batch_size):
        chunk = by_length[start:start + batch_size]
        states = hidden_states(target, [items[i] for i in chunk], layers)
        for i, value in zip(chunk, states):
            save_file({"hidden_states": value.to(dtype).contiguous(), "token_ids": items[i]["input_ids"]},
                      str(out / "hidden_states" / f"hs_{i}.safetensors"))
    table = datasets.Dataset.from_dict({
        "input_ids": [it["input_ids"].tolist() for it in items],
        "loss_mask": [it["loss_mask"].tolist() for it in items],
        "seq_len": [len(it["input_ids"]) for it in items],
    }, features=datasets.Features({"input_ids": datasets.List(datasets.Value("int64")),
                                   "loss_mask": datasets.List(datasets.Value("int64")),
                                   "seq_len": datasets.Value("int64")}))
    table.set_format(type="torch")  # what speculators' preprocessing saves: rows come back as tensors
    with quiet_datasets():
        table.save_to_disk(str(out))
    return out


def row_item(row, max_length: int) -> dict:
    """One row cut to max_length, as our training's RowSet cuts it: input_ids and loss_mask [s] int64."""
    return {"input_ids": torch.as_tensor(np.asarray(row["input_ids"])[:max_length], dtype=torch.long),
            "loss_mask": torch.as_tensor(np.asarray(row["loss_mask"])[:max_length], dtype=torch.long)}


@torch.no_grad()
def hidden_states(target, items: list[dict], layers) -> list[torch.Tensor]:
    """Per row: [s, 4, H] = the fused layers (hidden_states indices `layers`), then the input of the final norm."""
    batch = collate(items)
    base = getattr(target, "base_model", target)
    captured = []
    hook = base.norm.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    try:
        fused = target_features(target, batch["input_ids"], batch["attention_mask"], tuple(layers))  # [b, s, 3H]
    finally:
        hook.remove()
    b, s, _ = fused.shape
    stacked = torch.cat([fused, captured[0]], dim=-1).reshape(b, s, len(layers) + 1, -1)
    return [stacked[j, : len(it["input_ids"])] for j, it in enumerate(items)]
