"""The training loop: one explicit Accelerate loop that trains a drafter on a frozen target.

    run_dir = run_training(load_recipe("eagle-smollm2"))      # or: draftheads train RECIPE

Each optimizer step takes grad_accum micro-batches of whole rows [b, s] (right-padded, length-
bucketed) -> target features [b, s, F] (online: target forward under no_grad; offline: read from
the on-disk cache) -> drafter.training_loss -> backward; then clipping, AdamW and the LR schedule.
Metrics every log_every steps, eval every eval_every (the best drafter is chosen by simulated
acceptance length, not loss), checkpoints every save_every, and runs/<name>/final/ at the end.
The same code runs single-process or under `accelerate launch` (DDP, FSDP, DeepSpeed).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftheads.config import to_dict
from draftheads.errors import DraftheadsError
from draftheads.training import batches as B
from draftheads.training import checkpoint as C
from draftheads.training.features import build_feature_cache, cache_key, target_features
from draftheads.training.hardware import resolve_dtype
from draftheads.training.metrics import DepthStats, flat_metrics
from draftheads.training.trackers import check_trackers, prepare_environment, start_trackers


class DraftLoss(torch.nn.Module):
    """Routes forward() to drafter.training_loss, so DDP/FSDP wrappers see a normal forward call."""

    def __init__(self, drafter: torch.nn.Module):
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: dict):
        return self.drafter.training_loss(batch)


@dataclass
class Run:
    """Everything the loop needs, built once by `setup`."""

    recipe: object
    accelerator: object
    target: torch.nn.Module
    drafter: torch.nn.Module
    module: torch.nn.Module  # DraftLoss, prepared (possibly DDP-wrapped)
    optimizer: object
    scheduler: object
    rows: B.RowSet
    lengths: np.ndarray
    train_idx: np.ndarray
    eval_idx: np.ndarray
    state: dict
    run_dir: Path

    @property
    def online(self) -> bool:
        return self.rows.features is None

    @property
    def target_runs_inside(self) -> bool:
        """Medusa-2 trains LoRA on the target: the drafter runs the target itself, with gradients."""
        return bool(getattr(self.drafter, "needs_target_grad", False))


def run_training(recipe, *, target=None, drafter=None, after_step=None) -> Path:
    """Train the recipe's drafter; returns the run folder (runs/<name>/, with final/drafter/ inside).

    target: (model, tokenizer) or a model, instead of loading recipe.target (tests pass fixtures).
    drafter: a drafter to train instead of building one from recipe.head.
    after_step: called with the step number after every optimizer step (and its checkpoint).
    """
    accelerator = make_accelerator(recipe)
    run = setup(recipe, accelerator, target, drafter)
    try:
        train(run, after_step)
    finally:
        accelerator.end_training()
        release_accelerate_state()
    return run.run_dir


def release_accelerate_state() -> None:
    """Let a later run_training in this process pick its own precision and accumulation (Accelerate keeps
    them in process-wide singletons); the process group itself (PartialState) stays."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def make_accelerator(recipe):
    from accelerate import Accelerator, PartialState
    from accelerate.utils import ProjectConfiguration

    cfg = recipe.train
    check_trackers(recipe.log.trackers)
    run_dir = recipe.run_dir
    prepare_environment(recipe.log, run_dir)
    cpu = recipe.target.device == "cpu"
    dtype = resolve_dtype(cfg.dtype, PartialState(cpu=cpu).device)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")
    return Accelerator(
        cpu=cpu,
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.grad_accum,
        log_with=list(recipe.log.trackers) or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
    )


def setup(recipe, accelerator, target=None, drafter=None) -> Run:
    """Target, drafter, data, optimizer and schedule, prepared; state restored from a checkpoint if resuming."""
    from accelerate.utils import set_seed

    cfg = recipe.train
    if cfg.mode == "offline" and getattr(recipe.head, "medusa2", False):
        raise DraftheadsError("head.medusa2 trains LoRA on the target, so it cannot use cached features; set train.mode=online")
    model = _target_model(recipe, accelerator, target)
    recipe.resolve(model.config)
    set_seed(cfg.seed)  # the drafter's initial weights depend on the seed only
    rows = B.load_rows(recipe.data_dir)
    lengths = B.row_lengths(rows, cfg.max_length)
    train_idx, eval_idx = B.split_rows(len(rows), cfg.eval_fraction, cfg.seed)
    if drafter is None:
        drafter = make_drafter(recipe, model, rows, train_idx)
    drafter.to(device=accelerator.device, dtype=torch.float32)  # fp32 master weights; autocast does bf16/fp16
    rowset = make_rowset(recipe, accelerator, model, drafter, rows, lengths)
    optimizer = make_optimizer(drafter, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, cfg.max_steps, cfg.schedule))
    module, optimizer = accelerator.prepare(DraftLoss(drafter), optimizer)
    accelerator.register_for_checkpointing(scheduler)
    set_seed(cfg.seed + accelerator.process_index)  # per-process noise (EAGLE input noise, dropout)
    run = Run(recipe, accelerator, model, drafter, module, optimizer, scheduler, rowset, lengths, train_idx, eval_idx,
              new_state(), recipe.run_dir)
    resume(run)
    return run


def _target_model(recipe, accelerator, target):
    from draftheads.training.target import load_target

    if target is not None:
        model = target[0] if isinstance(target, (tuple, list)) else target
        return model.to(accelerator.device)
    t = recipe.target
    model, _ = load_target(t.name, dtype=resolve_dtype(recipe.train.dtype, accelerator.device), device=str(accelerator.device),
                           revision=t.revision, trust_remote_code=t.trust_remote_code, chat_template=t.chat_template,
                           attn_implementation=t.attn_implementation)
    return model


def make_drafter(recipe, model, rows, train_idx):
    """A new drafter from recipe.head (EAGLE-3: with its draft vocabulary), or head.init_from's weights."""
    from draftheads.api import build_drafter, load_drafter

    head = recipe.head
    if head.init_from:
        drafter = load_drafter(head.init_from, model)
        if drafter.config.type != head.type:
            raise DraftheadsError(f"head.init_from '{head.init_from}' holds a {drafter.config.type} drafter but head.type is {head.type}")
        return drafter
    cfg = {k: v for k, v in to_dict(head).items() if k != "type"}
    drafter = build_drafter(head.type, model, **cfg)
    if hasattr(drafter, "set_draft_vocab") and getattr(drafter.config, "eagle3", True):  # EAGLE-1/2 use the full vocabulary
        vocab = recipe.derived["vocab_size"]
        drafter.set_draft_vocab(B.loss_token_counts(rows, train_idx, recipe.train.max_length, vocab))
    return drafter


def make_rowset(recipe, accelerator, model, drafter, rows, lengths) -> B.RowSet:
    """Rows as tensors; in offline mode with the feature cache attached (built first if missing)."""
    cfg = recipe.train
    if cfg.mode == "online":
        return B.RowSet(rows, cfg.max_length)
    if getattr(drafter, "needs_target_grad", False):
        raise DraftheadsError("this drafter trains the target itself, so it cannot use cached features; set train.mode=online")
    layers = tuple(drafter.feature_layers)
    folder = Path(cfg.feature_cache) if cfg.feature_cache else (
        recipe.data_dir / "features" / cache_key(model, layers, cfg.max_length, cfg.feature_dtype, rows, lengths))
    cache = build_feature_cache(accelerator, model, B.RowSet(rows, cfg.max_length), lengths, layers, folder,
                                cfg.feature_dtype, cfg.batch_size)
    if not np.array_equal(cache.lengths, lengths) or cache.dim != model.config.get_text_config().hidden_size * len(layers):
        raise DraftheadsError(f"feature cache {folder} was built for other data or feature layers; delete it or set train.feature_cache elsewhere")
    return B.RowSet(rows, cfg.max_length, cache)


def make_optimizer(drafter, cfg) -> torch.optim.Optimizer:
    groups = drafter.param_groups(cfg.lr) if hasattr(drafter, "param_groups") else [
        {"params": [p for p in drafter.parameters() if p.requires_grad]}]
    if not any(p.requires_grad for g in groups for p in g["params"]):
        raise DraftheadsError("the drafter has no trainable parameters; check the head configuration")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-based): linear warm-up, then cosine/linear/constant to 0."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress


def new_state() -> dict:
    """The trainer state saved as JSON in every checkpoint."""
    return {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_metric": None, "best_step": None,
            "history": [], "eval_history": [], "window": None, "train_seconds": 0.0, "tokens": 0}


def resume(run: Run) -> None:
    cfg, acc = run.recipe.train, run.accelerator
    for folder in C.incomplete_checkpoints(run.run_dir):
        acc.print(f"draftheads: skipping half-written checkpoint {folder} (no {C.COMPLETE} marker)")
    folder = C.find_resume(run.run_dir, cfg.resume)
    if folder is not None:
        run.state = C.load_checkpoint(acc, folder)
        acc.print(f"draftheads: resuming from {folder} (step {run.state['step']})")


def micro_batches(run: Run):
    """Endless micro-batches for this process; run.state's (epoch, batch_in_epoch) tracks the position."""
    cfg, acc, state = run.recipe.train, run.accelerator, run.state
    while True:
        epoch = B.epoch_batches(run.train_idx, run.lengths, cfg.batch_size, cfg.seed, state["epoch"], cfg.bucket_by_length)
        mine = B.shard(epoch, acc.process_index, acc.num_processes)
        if not mine:
            raise DraftheadsError(f"{len(run.train_idx)} training rows make no full batch of train.batch_size={cfg.batch_size} "
                                  f"on each of {acc.num_processes} process(es); lower train.batch_size or generate more data")
        # A private generator: a DataLoader otherwise draws its base seed from the global RNG when an
        # epoch starts, and a resumed run (which restarts the epoch's loader) would drift from a straight one.
        loader = torch.utils.data.DataLoader(run.rows, batch_sampler=mine[state["batch_in_epoch"]:], collate_fn=B.collate,
                                             generator=torch.Generator())
        for batch in loader:
            state["batch_in_epoch"] += 1
            yield batch
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def with_features(run: Run, batch: dict) -> dict:
    """The batch on the device, with the target's features added in online mode."""
    device = run.accelerator.device
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if run.online and not run.target_runs_inside:
        batch["features"] = target_features(run.target, batch["input_ids"], batch["attention_mask"], run.drafter.feature_layers)
    return batch


def train_step(run: Run, batches) -> DepthStats:
    """One optimizer step over grad_accum micro-batches; returns this process's metrics."""
    acc, cfg = run.accelerator, run.recipe.train
    stats = DepthStats()
    for _ in range(cfg.grad_accum):
        batch = with_features(run, next(batches))
        with acc.accumulate(run.module):
            loss, metrics = run.module(batch)
            acc.backward(loss)
            if acc.sync_gradients and cfg.max_grad_norm > 0:
                acc.clip_grad_norm_(run.module.parameters(), cfg.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        stats.add(metrics, loss, int(batch["attention_mask"].sum()))
    run.scheduler.step()
    return stats


@torch.no_grad()
def evaluate(run: Run, depth: int) -> dict | None:
    """Metrics on the eval split (drafter in eval mode: no input noise), summed over processes."""
    if len(run.eval_idx) == 0:
        return None
    acc = run.accelerator
    model = acc.unwrap_model(run.module)  # no DDP wrapper: processes may see different batch counts here
    stats = DepthStats()
    model.eval()
    batches = B.eval_batches(run.eval_idx, run.lengths, run.recipe.train.batch_size)
    for idx in batches[acc.process_index::acc.num_processes]:
        batch = with_features(run, B.collate([run.rows[i] for i in idx]))
        loss, metrics = model(batch)
        stats.add(metrics, loss, int(batch["attention_mask"].sum()))
    model.train()
    return gather(acc, stats, depth)[0].summary()


def gather(acc, stats: DepthStats, depth: int, flag: float = 0.0) -> tuple[DepthStats, float]:
    """Sum every process's metrics and a flag (e.g. "out of time") with one all-reduce."""
    values = stats.values if stats.values is not None else torch.zeros(3 * depth + 3, dtype=torch.float64)
    values = torch.cat([values, torch.tensor([flag], dtype=torch.float64)]).to(acc.device)
    total = acc.reduce(values, reduction="sum").cpu()
    return DepthStats(total[:-1].tolist()), float(total[-1])


def train(run: Run, after_step=None) -> None:
    """The loop: step, log, eval, checkpoint, until max_steps or the time budget; then final/."""
    from tqdm.auto import tqdm

    recipe, acc, state = run.recipe, run.accelerator, run.state
    cfg = recipe.train
    start_trackers(acc, recipe.log, recipe.name, recipe.to_dict())
    batches = micro_batches(run)
    window = DepthStats(state["window"])
    bar = tqdm(total=cfg.max_steps, initial=state["step"], desc=f"train {recipe.name}", unit="step",
               disable=not acc.is_main_process, dynamic_ncols=True)
    clock = Clock(state["train_seconds"])
    budget = cfg.time_budget_minutes * 60 if cfg.time_budget_minutes else math.inf
    stopped_by = "max_steps"
    depth = len(state["history"][-1]["acc"]) if state["history"] else 0
    while state["step"] < cfg.max_steps:
        out_of_time = acc.is_main_process and clock.total() > budget  # decided by one process, shared below
        with clock.stepping():
            local = train_step(run, batches)
        depth = local.depth
        stats, flag = gather(acc, local, depth, float(out_of_time))
        state["step"] += 1
        step = state["step"]
        window.merge(stats)
        clock.tokens += stats.summary()["tokens"]
        bar.update(1)
        bar.set_postfix(loss=f"{stats.summary()['loss']:.3f}", tok_s=f"{clock.tokens_per_second():,.0f}")
        last = step == cfg.max_steps or flag > 0
        if step % cfg.log_every == 0 or last:
            log_window(run, window, clock, bar)
            window = DepthStats()
        if step % cfg.eval_every == 0 or last:
            eval_and_keep_best(run, depth, bar)
        state["window"], state["train_seconds"] = window.state(), clock.total()
        if step % cfg.save_every == 0 or last:
            save(run)
        if after_step is not None:
            after_step(step)
        if flag:
            stopped_by = "time_budget"
            bar.write(f"draftheads: the time budget ({cfg.time_budget_minutes:g} min) ran out after step {step} of "
                      f"{cfg.max_steps}; checkpoint saved, finishing now (raise train.time_budget_minutes to train longer)")
            break
    bar.close()
    finish(run, stopped_by, depth, clock)


class Clock:
    """Wall time of the whole run (across resumes, for the budget) and of this session's training steps."""

    def __init__(self, earlier_seconds: float):
        self.earlier, self.start = earlier_seconds, time.perf_counter()
        self.step_seconds, self.tokens = 0.0, 0
        self.window_seconds, self.window_tokens = 0.0, 0

    def total(self) -> float:
        return self.earlier + time.perf_counter() - self.start

    def stepping(self):
        clock = self

        class _Timer:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                clock.step_seconds += time.perf_counter() - self.t
                clock.window_seconds += time.perf_counter() - self.t

        return _Timer()

    def tokens_per_second(self) -> float:
        """Training tokens per second of step time in this session (eval and checkpoint time excluded)."""
        return self.tokens / max(self.step_seconds, 1e-9)


def log_window(run: Run, window: DepthStats, clock: Clock, bar) -> None:
    """Summarise the steps since the last log: history entry, trackers, one printed line."""
    state, acc = run.state, run.accelerator
    summary = window.summary()
    rate = (summary["tokens"] / clock.window_seconds) if clock.window_seconds > 0 else 0.0
    clock.window_seconds = 0.0
    lr = run.scheduler.get_last_lr()[0]
    entry = {"step": state["step"], "loss": summary["loss"], "acc": summary["acc"], "depth_loss": summary["depth_loss"],
             "accept_len": summary["accept_len"], "lr": lr}
    state["history"].append(entry)
    acc.log({**flat_metrics("train", summary), "train/lr": lr, "train/tokens_per_s": rate}, step=state["step"])
    accs = "/".join(f"{a:.3f}" for a in summary["acc"])
    bar.write(f"step {state['step']:>6} | loss {summary['loss']:.4f} | acc {accs} | accept {summary['accept_len']:.3f} "
              f"| lr {lr:.2e} | {rate:,.0f} tok/s")


def eval_and_keep_best(run: Run, depth: int, bar) -> dict | None:
    """Evaluate; if the simulated acceptance length beats the best so far, write best/drafter/."""
    state, acc = run.state, run.accelerator
    summary = evaluate(run, depth)
    if summary is None:
        return None
    entry = {"step": state["step"], **{k: summary[k] for k in ("loss", "acc", "depth_loss", "accept_len", "positions")}}
    state["eval_history"].append(entry)
    acc.log(flat_metrics("eval", summary), step=state["step"])
    better = state["best_metric"] is None or summary["accept_len"] > state["best_metric"]
    if better:
        state["best_metric"], state["best_step"] = summary["accept_len"], state["step"]
        if acc.is_main_process:
            C.replace_folder(lambda tmp: write_best(run, tmp, entry), run.run_dir / "best")
    acc.wait_for_everyone()
    accs = "/".join(f"{a:.3f}" for a in summary["acc"])
    bar.write(f"eval {state['step']:>6} | loss {summary['loss']:.4f} | acc {accs} | accept {summary['accept_len']:.3f}"
              + (" | best" if better else f" | best {state['best_metric']:.3f} at step {state['best_step']}"))
    return entry


def write_best(run: Run, folder: Path, entry: dict) -> None:
    C.write_drafter(run.drafter, folder / "drafter", run.target, {"step": entry["step"], "eval": entry})
    C.write_json(folder / "metrics.json", entry)


def save(run: Run) -> Path:
    """Checkpoint the current step (all processes), then prune old ones (never the best)."""
    folder = C.save_checkpoint(run.accelerator, run.run_dir, run.state["step"], run.drafter, run.state,
                               run.recipe.to_dict(), run.target)
    if run.accelerator.is_main_process:
        C.prune(run.run_dir, run.recipe.train.keep_last, protect=run.state["best_step"])
    run.accelerator.wait_for_everyone()
    return folder


def finish(run: Run, stopped_by: str, depth: int, clock: Clock) -> None:
    """final/drafter/ and final/metrics.json; print the held-out accuracy and the training throughput."""
    state, acc, cfg = run.state, run.accelerator, run.recipe.train
    final_eval = next((e for e in state["eval_history"] if e["step"] == state["step"]), None)
    if final_eval is None and depth and len(run.eval_idx):  # resumed a run that had already finished
        final_eval = eval_and_keep_best(run, depth, _Printer(acc))
    metrics = {
        "steps": state["step"], "max_steps": cfg.max_steps, "stopped_by": stopped_by, "mode": cfg.mode,
        "train_seconds": state["train_seconds"], "train_tokens_per_s": clock.tokens_per_second(),
        "final_eval": final_eval, "best_accept_len": state["best_metric"], "best_step": state["best_step"],
        "history": state["history"], "eval_history": state["eval_history"],
    }
    if acc.is_main_process:
        def build(tmp):
            C.write_drafter(run.drafter, tmp / "drafter", run.target, {"step": state["step"], "eval": final_eval})
            C.write_json(tmp / "metrics.json", metrics)
        C.replace_folder(build, run.run_dir / "final")
    acc.wait_for_everyone()
    if final_eval is not None:
        acc.print(f"draftheads: held-out top-1 accuracy of depth 1: {final_eval['acc'][0]:.3f} "
                  f"(all depths {'/'.join(f'{a:.3f}' for a in final_eval['acc'])}; simulated acceptance length "
                  f"{final_eval['accept_len']:.3f}; best {state['best_metric']:.3f} at step {state['best_step']})")
    acc.print(f"draftheads: {cfg.mode} training: {clock.tokens_per_second():,.0f} tokens/s over {state['step']} steps "
              f"({stopped_by}); drafter in {run.run_dir / 'final' / 'drafter'}")


class _Printer:
    def __init__(self, acc):
        self.acc = acc

    def write(self, text: str) -> None:
        self.acc.print(text)
