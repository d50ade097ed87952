"""Updated targets: the target fine-tuned again (LoRA or all its weights) on text of its own writing, made
reproducibly so what a target update does to its drafter can be measured (`draftheads drift`).

    folder = update_target("data/update-writing", "targets/lora-120", UpdateConfig(method="lora", steps=120))
    draftheads update-target data/update-writing --method full --steps 40 --out targets/full-40

The data is a `draftheads data` folder the base target wrote (for the bundled measurements: its own sampled answers
to prompts of other kinds than the drafter was trained on, a domain shift). Training is plain next-token loss on the
answer tokens (the rows' loss mask), AdamW at a constant learning rate after a short warm-up, the rows in a seeded
order; the strength of the update is its steps and learning rate. A LoRA update is merged into the weights, so every
update is an ordinary Hugging Face folder (safetensors, tokenizer with its chat template) that any `--target` takes.

The folder is published atomically when training ends, with `draftheads_update.json` (settings, the data it came
from, losses); asked again with the same settings it is reused, with others it is refused. A killed update leaves
nothing behind and starts over when rerun: it is minutes long, and a resumable checkpoint of a whole target and its
optimizer moments would be three times the target's size on disk.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import write_folder
from draftheads.core.state_files import read_json
from draftheads.core.writable import check_writable
from draftheads.data.datastore import read_meta
from draftheads.data.hardware import resolve_device, resolve_dtype
from draftheads.data.target import load_target
from draftheads.data.datastore import load_rows
from draftheads.training.batches import answered_rows
from draftheads.drift.drift_config import UpdateConfig

MARKER = "draftheads_update.json"
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def update_target(data: str | Path, out: str | Path, config: UpdateConfig | None = None, *, target=None,
                  progress=print) -> Path:
    """Fine-tune config.base (or `target`: (model, tokenizer), for tests) on `data`'s answers; the new target's
    folder. Reused when `out` holds an update with the same settings and data."""
    config = config or UpdateConfig()
    out, data = Path(out), Path(data)
    record = {"settings": asdict(config), "data": data_identity(data)}
    if reused(out, record):
        progress(f"draftheads update-target: {out} already holds this update; reused")
        return out
    check_writable(out, "--out", published=True)  # now, not after the fine-tuning
    rows = load_rows(data)
    rows = rows.select(answered_rows(rows, config.max_length, "the update's max_length", progress))   # before loading
    model, tokenizer = target if target is not None else load_target(config.base, dtype="fp32", device="cpu")
    trainable = trainable_model(model, config)
    started = time.monotonic()
    losses = fine_tune(trainable, rows, config, progress)
    updated = trainable.merge_and_unload() if config.method == "lora" else trainable
    updated.requires_grad_(False).eval()
    record.update(losses=losses, seconds=round(time.monotonic() - started, 1), rows=len(rows))

    def fill(tmp: Path) -> None:
        updated.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(record, indent=2))

    write_folder(out, fill)
    progress(f"draftheads update-target: {config.method} x {config.steps} steps in {record['seconds']:.0f} s, loss "
             f"{losses[0]:.3f} -> {losses[-1]:.3f}; the updated target: {out}")
    return out


def data_identity(data: Path) -> dict:
    """What identifies a data folder's rows: its recipe hash and row count as `draftheads data` recorded them."""
    meta = read_meta(data) if data.is_dir() else {}
    return {"folder": str(data), "recipe_hash": meta.get("recipe_hash"),
            "rows": (meta.get("summary") or {}).get("rows")}


def reused(out: Path, record: dict) -> bool:
    if not out.exists():
        return False
    marker = out / MARKER
    # a damaged marker is refused, never taken for another update and written over
    saved = read_json(marker, "update marker", f"delete {out} (this update's output) and rerun, or give another --out",
                      required=("settings", "data")) if marker.exists() else None
    if saved is None or saved.get("settings") != record["settings"] or saved.get("data") != record["data"]:
        raise DraftheadsError(f"'{out}' already exists and is not this update (other settings, data or not an "
                              "update at all); give another --out, or remove it yourself")
    return True


def trainable_model(model, config: UpdateConfig):
    model.requires_grad_(config.method == "full")
    model.train()
    if config.method == "full":
        return model
    from peft import LoraConfig, get_peft_model   # only updates and Medusa-2 need peft
    torch.manual_seed(config.seed)
    adapters = LoraConfig(r=config.rank, lora_alpha=2 * config.rank, lora_dropout=0.0, target_modules=LORA_MODULES)
    return get_peft_model(model, adapters)


def fine_tune(model, rows, config: UpdateConfig, progress) -> list[float]:
    """config.steps AdamW steps of next-token loss on the answers; the loss of every step."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    autocast_dtype = resolve_dtype("auto", resolve_device("cpu"))   # bf16 where the CPU has it: 2-3x faster
    order = np.random.default_rng(config.seed).permutation(len(rows))
    losses = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = config.lr * min(1.0, (step + 1) / (config.warmup_steps + 1))
        picked = [int(order[(step * config.batch_size + i) % len(order)]) for i in range(config.batch_size)]
        input_ids, labels, attention = answer_batch(rows, picked, config.max_length)
        with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
        if (step + 1) % 10 == 0 or step + 1 == config.steps:
            progress(f"draftheads update-target: step {step + 1}/{config.steps} loss {np.mean(losses[-10:]):.3f}")
    return losses


def answer_batch(rows, picked: list[int], max_length: int):
    """[b, s] input ids, labels (-100 outside the answers, which the model shifts itself) and attention mask; rows
    padded on the right."""
    found = rows[picked]
    ids = [np.asarray(x[:max_length]) for x in found["input_ids"]]
    masks = [np.asarray(m[:max_length]) for m in found["loss_mask"]]
    width = max(len(x) for x in ids)
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    labels = torch.full((len(ids), width), -100, dtype=torch.long)
    attention = torch.zeros(len(ids), width, dtype=torch.long)
    for i, (x, m) in enumerate(zip(ids, masks)):
        row = torch.as_tensor(x, dtype=torch.long)
        input_ids[i, :len(x)] = row
        attention[i, :len(x)] = 1
        labels[i, :len(x)] = torch.where(torch.as_tensor(m) > 0, row, -100)
    return input_ids, labels, attention
