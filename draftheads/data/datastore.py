"""The data folder on disk: identity (recipe hash), completed shards, the merged dataset, the summary.

    data/<name>/
        draftheads_data.json       recipe hash, target + data settings, summary, complete flag
        prompts.jsonl              the prompts, fixed once (ids = line numbers)
        shards/shard_000003/       one finished shard (datasets folder + stats.json); renamed in when complete
        shards/base/               while growing: the rows the folder already held (datasets folder + stats.json)
        data-*.arrow, state.json   the merged dataset (datasets.load_from_disk(folder))

Raising data.num_prompts of a finished folder grows it: its rows are kept and only the new prompts
are answered. The new prompts are drawn with other seeds (and never repeat a kept one), so a grown
folder holds different rows from one generated at the larger count in one go.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import datasets
import numpy as np

from draftheads.core.config import to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import DATA_MARKER
from draftheads.core.state_files import read_json

META = DATA_MARKER
COLUMNS = ("input_ids", "loss_mask")   # what training and evaluation read of a row
PROMPT_ID = "prompt_id"                 # which prompt a row answers: the hold-out keeps a prompt's rows together
SHARDS = "shards"
BASE = "base"
# Settings that change no row: a run may resume with a different batch size or server address.
NOT_HASHED = ("output", "batch_size", "concurrency", "max_retries", "openai_url")
TARGET_HASHED = ("name", "revision", "dtype", "chat_template")
# How the summary names responses and prompts that were kept although cut; read back when a folder grows.
CUT = "responses cut at max_new_tokens/max_length (kept, no end-of-turn)"
TRUNCATED = "prompts truncated to fit max_length (kept)"


# Prompt-source settings added after folders were written, with their defaults: hashed only when set otherwise, so a
# folder written before they existed keeps its identity.
ADDED_LATER = {"kinds": None, "passage_tokens": 512}
DATA_ADDED_LATER = {"reasoning": "keep", "mode": "chat", "samples_per_prompt": 1,  # the same for data settings
                    "temperatures": None}
META_FIX = "regenerate the folder with `draftheads data RECIPE --overwrite`, or delete it and rerun"


def settings_hash(target: dict, data: dict) -> str:
    """Hash of every setting that changes the rows (target identity and the data section)."""
    data = {k: v for k, v in data.items()
            if k not in NOT_HASHED and not (k in DATA_ADDED_LATER and v == DATA_ADDED_LATER[k])}
    if isinstance(data.get("prompts"), list):
        data["prompts"] = [{k: v for k, v in src.items() if k not in ADDED_LATER or v != ADDED_LATER[k]}
                           if isinstance(src, dict) else src for src in data["prompts"]]
    target = {k: target.get(k) for k in TARGET_HASHED}
    text = json.dumps({"target": target, "data": data}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recipe_hash(recipe) -> str:
    return settings_hash(to_dict(recipe.target), to_dict(recipe.data))


def read_meta(out: Path) -> dict:
    """The folder's draftheads_data.json ({} where it has none); a damaged one is a one-line error naming it."""
    path = Path(out) / META
    return read_json(path, "data folder metadata", META_FIX) if path.exists() else {}


def recorded_mode(out: Path) -> str | None:
    """How the folder's prompts were rendered (data.mode, kept in its metadata): 'chat' for a folder written before
    data.mode existed, None for one draftheads did not write."""
    meta = read_meta(out)
    data = meta.get("data")
    return (data.get("mode") or "chat") if isinstance(data, dict) else None


def check_mode(out: Path, mode: str) -> None:
    """A drafter is trained, and then evaluated, in the data.mode its rows were made in: its run's recipe copy is what
    `draftheads eval` renders prompts by."""
    recorded = recorded_mode(out)
    if recorded is not None and recorded != mode:
        raise DraftheadsError(f"'{out}' was generated with data.mode: {recorded} but the recipe says {mode}; set "
                              f"data.mode={recorded}, so that evaluation prompts the drafter as its data did")


def write_meta(out: Path, meta: dict) -> None:
    tmp = Path(out) / (META + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    tmp.replace(Path(out) / META)  # atomic: never a half-written identity file


def update_meta(out: Path, **changes) -> None:
    write_meta(out, {**read_meta(out), **changes})


def is_complete(out: Path) -> bool:
    return bool(read_meta(out).get("complete"))


def folder_plan(out: Path, recipe, overwrite: bool) -> str:
    """What `draftheads data` will do with `out`: 'new' (no folder yet), 'empty' (an empty folder), 'resume' (same
    settings), 'grow' (more prompts) or 'replace' (overwrite); a folder holding anything else is refused. Writes
    nothing."""
    out, key = Path(out), recipe_hash(recipe)
    if out.exists() and not out.is_dir():
        raise DraftheadsError(f"data output '{out}' is a file; set data.output to a folder")
    if not out.exists():
        return "new"
    if not any(out.iterdir()):
        return "empty"
    try:
        old = read_meta(out)
    except DraftheadsError:
        if overwrite:   # damaged, yet the file says the folder is draftheads data: regenerated, as --overwrite asks
            return "replace"
        raise
    if not old:
        raise DraftheadsError(f"data output '{out}' is not empty and was not written by draftheads data; "
                              "set data.output to another folder or empty it")
    if overwrite:
        return "replace"
    if old.get("recipe_hash") == key:
        return "resume"
    if can_grow(old, recipe):
        return "grow"
    raise DraftheadsError(f"'{out}' holds data from a different recipe (hash {old.get('recipe_hash')}, now {key}); "
                          "rerun with --overwrite to replace it, or set data.output to another folder")


def prepare_folder(out: Path, recipe, plan: str) -> None:
    """Carry out folder_plan's `plan`: create the folder (claiming it for these settings), or accept it for resuming."""
    out = Path(out)
    if plan == "resume":
        remove_partial(out)
        return
    if plan == "grow":
        start_growing(out, read_meta(out), recipe)
        return
    if plan == "replace":
        shutil.rmtree(out)  # a draftheads data folder, replaced because --overwrite asked for it
    out.mkdir(parents=True, exist_ok=True)
    write_meta(out, {"recipe_hash": recipe_hash(recipe), "complete": False,
                     "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "target": to_dict(recipe.target), "data": to_dict(recipe.data)})


def release_folder(out: Path) -> None:
    """Remove a folder prepare_folder created for a new dataset while it holds nothing but its claim (the metadata)."""
    out = Path(out)
    if out.is_dir() and {p.name for p in out.iterdir()} <= {META}:
        shutil.rmtree(out)


def can_grow(old: dict, recipe) -> bool:
    """The folder holds finished rows of these very settings, only for fewer prompts."""
    if not old.get("complete") or "data" not in old or "target" not in old:
        return False
    before = old["data"].get("num_prompts", 0)
    same = settings_hash(old["target"], {**old["data"], "num_prompts": recipe.data.num_prompts}) == recipe_hash(recipe)
    return same and before < recipe.data.num_prompts


def start_growing(out: Path, old: dict, recipe) -> None:
    """Keep the folder's rows as shards/base and mark it unfinished for the larger prompt count."""
    out, summary = Path(out), old.get("summary", {})
    print(f"draftheads data: '{out}' holds the rows of {old['data']['num_prompts']} prompts; keeping them and "
          f"answering {recipe.data.num_prompts - old['data']['num_prompts']} new ones (data.num_prompts is now "
          f"{recipe.data.num_prompts})")
    remove_partial(out)
    base = shard_path(out, BASE)
    if not base.exists():
        tmp = base.parent / f".tmp-{base.name}-{os.getpid()}"
        with quiet_datasets():
            datasets.load_from_disk(str(out)).save_to_disk(str(tmp))
        (tmp / "stats.json").write_text(json.dumps(summary_as_stats(summary, old.get("prompt_skips", {}))))
        os.replace(tmp, base)
    # The next feature cache takes the kept rows' shards from a complete old one (training/features.py).
    # An unfinished cache, or one written before shard digests were recorded, cannot serve, so it goes now.
    for cache in sorted((out / "features").glob("*")):
        if not can_serve(cache):
            shutil.rmtree(cache, ignore_errors=True)
    grown = {"prompts": summary.get("prompts", 0), "prompt_skips": old.get("prompt_skips", {})}
    write_meta(out, {**old, "recipe_hash": recipe_hash(recipe), "complete": False, "data": to_dict(recipe.data),
                     "grown_from": grown, "grown": old.get("grown", []) + [
                         {"from": old["data"]["num_prompts"], "to": recipe.data.num_prompts,
                          "date": time.strftime("%Y-%m-%d %H:%M:%S")}]})


def can_serve(cache: Path) -> bool:
    """A complete feature cache with shard digests; a damaged manifest is said, and the cache then goes too."""
    manifest = cache / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        return "shard_digests" in read_json(manifest, "feature cache manifest", "removing that cache (training "
                                            "builds it again)")
    except DraftheadsError as e:
        print(f"draftheads data: {e}", flush=True)
        return False


def summary_as_stats(summary: dict, prompt_skips: dict) -> dict:
    """A finished folder's summary in the form of one shard's stats, so the grown folder's summary adds up."""
    dropped = dict(summary.get("dropped", {}))
    cut, truncated = dropped.pop(CUT, 0), dropped.pop(TRUNCATED, 0)
    # What the summary dropped besides the prompt skips (kept in the metadata) were first turns stopped at planning.
    stopped = {k: n - prompt_skips.get(k, 0) for k, n in dropped.items() if n > prompt_skips.get(k, 0)}
    return {"rows": summary.get("rows", 0), "tokens": summary.get("tokens", 0),
            "generated_tokens": summary.get("generated_tokens", 0),
            "responses": summary.get("responses", 0), "cut_responses": cut, "truncated_prompts": truncated,
            "stopped": stopped, "seconds": summary.get("generation_seconds", 0.0)}


def remove_partial(out: Path) -> None:
    """Temp folders of shards that a killed run was writing."""
    for tmp in (Path(out) / SHARDS).glob(".tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def shard_path(out: Path, index: int | str) -> Path:
    return Path(out) / SHARDS / (index if isinstance(index, str) else f"shard_{index:06d}")


def shard_done(out: Path, index: int | str) -> bool:
    return shard_path(out, index).is_dir()


def split_shards(chats: list, size: int) -> list[list]:
    return [chats[i:i + size] for i in range(0, len(chats), size)]


def features():
    return datasets.Features({
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("int8")),
        "prompt_id": datasets.Value("int64"),
    })


@contextlib.contextmanager
def quiet_datasets():
    """datasets draws a progress bar per save; ours is the one that matters."""
    was_disabled = datasets.is_progress_bar_enabled() is False
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def shard_stats(chats: list, seconds: float) -> dict:
    kept = [c for c in chats if c.answered > 0]
    rows = [row for c in kept for row in c.rows()]
    stopped = collections.Counter(c.stopped for c in chats if c.stopped)  # rejected first turns leave no row
    return {
        "rows": len(rows), "tokens": sum(len(ids) for ids, _ in rows),
        "generated_tokens": sum(sum(mask) for _, mask in rows), "responses": sum(c.answered for c in kept),
        "cut_responses": sum(c.cut for c in kept), "truncated_prompts": sum(c.truncated for c in kept),
        "stopped": dict(stopped), "seconds": seconds,
    }


def write_shard(out: Path, index: int, chats: list, seconds: float) -> None:
    """Save a finished shard atomically: written to a temp folder, then renamed into place."""
    kept = [(c.prompt_id, ids, mask) for c in chats if c.answered > 0 for ids, mask in c.rows()]
    rows = {"input_ids": [ids for _, ids, _ in kept], "loss_mask": [mask for _, _, mask in kept],
            "prompt_id": [prompt_id for prompt_id, _, _ in kept]}
    final = shard_path(out, index)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    with quiet_datasets():
        datasets.Dataset.from_dict(rows, features=features()).save_to_disk(str(tmp))
    (tmp / "stats.json").write_text(json.dumps(shard_stats(chats, seconds)))
    os.replace(tmp, final)


def merge(out: Path, count: int, recipe, skipped: collections.Counter, num_prompts: int, processes: int = 1) -> None:
    """Join the shards in prompt order into the folder's dataset, write the summary, mark complete."""
    missing = [i for i in range(count) if not shard_done(out, i)]
    if missing:
        raise DraftheadsError(f"shards {missing[:5]} of '{out}' are missing; rerun the same command to finish them")
    # the rows kept from before a grow come first
    names = ([BASE] if shard_done(out, BASE) else []) + list(range(count))
    stats = [read_json(shard_path(out, i) / "stats.json", "shard statistics", shard_fix(out, i), required=("stopped",))
             for i in names]
    with quiet_datasets():
        parts = [datasets.load_from_disk(str(shard_path(out, i))) for i in names]
        table = datasets.concatenate_datasets(parts) if parts else datasets.Dataset.from_dict(
            {"input_ids": [], "loss_mask": [], "prompt_id": []}, features=features())
        ids = table["prompt_id"]
        table = table.select(sorted(range(len(ids)), key=ids.__getitem__))
        table.save_to_disk(str(out))
    update_meta(out, complete=True, grown_from=None,
                summary={**summarise(stats, skipped, num_prompts), "processes": processes})
    shutil.rmtree(Path(out) / SHARDS, ignore_errors=True)


def shard_fix(out: Path, index: int | str) -> str:
    """What to do about a damaged finished shard: generate it again, except the kept rows of a grow (base)."""
    if index == BASE:
        return META_FIX
    return f"delete {shard_path(out, index)} and rerun the same command to generate that shard again"


def summarise(stats: list[dict], skipped: collections.Counter, num_prompts: int) -> dict:
    total = collections.Counter()
    dropped = collections.Counter(skipped)
    for s in stats:
        total.update({k: v for k, v in s.items() if isinstance(v, (int, float))})
        dropped.update(s["stopped"])
    if total["cut_responses"]:
        dropped[CUT] += total["cut_responses"]
    if total["truncated_prompts"]:
        dropped[TRUNCATED] += total["truncated_prompts"]
    return {
        "prompts": num_prompts, "rows": total["rows"], "tokens": total["tokens"],
        "generated_tokens": total["generated_tokens"], "responses": total["responses"],
        "mean_response_tokens": total["generated_tokens"] / max(total["responses"], 1),
        "tokens_per_second": total["generated_tokens"] / max(total["seconds"], 1e-9),
        "generation_seconds": total["seconds"], "dropped": dict(dropped),
    }


def print_summary(out: Path) -> None:
    s = read_meta(out).get("summary", {})
    print(f"draftheads data: {s.get('rows', 0)} rows from {s.get('prompts', 0)} prompts, {s.get('tokens', 0)} tokens "
          f"({s.get('generated_tokens', 0)} generated), mean response {s.get('mean_response_tokens', 0):.1f} tokens")
    each = f" per process, {s['processes']} processes" if s.get("processes", 1) > 1 else ""
    print(f"  generation: {s.get('tokens_per_second', 0):.1f} tokens/s{each} over "
          f"{s.get('generation_seconds', 0):.1f} s")
    for reason, n in sorted(s.get("dropped", {}).items(), key=lambda kv: -kv[1]):
        print(f"  dropped/noted: {n} {reason}")
    print(f"  -> {out}")


def check_finished(data_dir: str | Path) -> Path:
    """The folder, when it exists and its metadata (if any) says it is finished: what can be checked before a
    target is loaded."""
    path = Path(data_dir)
    if not path.exists():
        raise DraftheadsError(f"training data '{path}' not found; run `draftheads data RECIPE` first or set "
                              "data.output")
    if (path / DATA_MARKER).exists() and not read_meta(path).get("complete"):
        raise DraftheadsError(f"'{path}' is unfinished: its `draftheads data` run stopped before the end; rerun "
                              "`draftheads data RECIPE` to finish it")
    return path


def prompt_groups(rows) -> np.ndarray | None:
    """[n] each row's prompt_id, or None for rows without the column (a folder written before it existed)."""
    if PROMPT_ID not in rows.column_names:
        return None
    return np.asarray(rows.with_format("numpy", columns=[PROMPT_ID])[PROMPT_ID], dtype=np.int64)


def load_rows(data_dir: str | Path):
    """The dataset saved by `draftheads data` (a `datasets` folder), checked for the columns we need."""
    path = check_finished(data_dir)
    try:
        rows = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many types for a damaged folder
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DraftheadsError(f"'{path}' cannot be read as a dataset saved by `draftheads data` ({first}); regenerate "
                              "it with `draftheads data RECIPE --overwrite`") from None
    if hasattr(rows, "keys") and not hasattr(rows, "column_names"):  # a DatasetDict
        if "train" not in rows:
            raise DraftheadsError(f"dataset '{path}' has splits {list(rows)} but no 'train' split")
        rows = rows["train"]
    missing = [c for c in COLUMNS if c not in rows.column_names]
    if missing:
        raise DraftheadsError(f"dataset '{path}' lacks column(s) {', '.join(missing)}; regenerate it with "
                              "`draftheads data`")
    if len(rows) == 0:
        raise DraftheadsError(f"dataset '{path}' is empty; regenerate it with more data.num_prompts")
    rows = rows.with_format("numpy", columns=list(COLUMNS))
    if not any(mask.any() for start in range(0, len(rows), 1024) for mask in rows[start : start + 1024]["loss_mask"]):
        raise DraftheadsError(f"dataset '{path}' has no generated tokens to train on (every loss_mask is 0); "
                              "regenerate it with `draftheads data`, whose rows mark the target's answers")
    return rows
