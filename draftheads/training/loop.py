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

import contextlib
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import write_folder
from draftheads.core.run_folder import BEST, DRAFTER, FINAL
from draftheads.interop.native import save_drafter
from draftheads.training import batches as B
from draftheads.training import checkpoint as C
from draftheads.training.features import target_features
from draftheads.training.hybrid_cache import store_batch
from draftheads.training.metrics import DepthStats, flat_metrics
from draftheads.training.setup import Run, exportable_drafter, make_accelerator, release_accelerate_state, setup
from draftheads.training.trackers import start_trackers


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


def micro_batches(run: Run):
    """Endless micro-batches for this process; run.state's (epoch, batch_in_epoch) tracks the position."""
    cfg, acc, state = run.recipe.train, run.accelerator, run.state
    while True:
        epoch = (B.epoch_packs(run.train_idx, run.lengths, cfg.batch_size, cfg.max_length, cfg.seed, state["epoch"])
                 if cfg.pack else B.epoch_batches(run.train_idx, run.lengths, cfg.batch_size, cfg.seed,
                                                  state["epoch"], cfg.bucket_by_length))
        mine = B.shard(epoch, acc.process_index, acc.num_processes)
        if not mine:
            raise DraftheadsError(f"{len(run.train_idx)} training rows make no full batch of "
                                  f"train.batch_size={cfg.batch_size} on each of {acc.num_processes} process(es); "
                                  "lower train.batch_size or generate more data")
        # A private generator: a DataLoader otherwise draws its base seed from the global RNG when an
        # epoch starts, and a resumed run (which restarts the epoch's loader) would drift from a straight one.
        loader = torch.utils.data.DataLoader(run.rows, batch_sampler=mine[state["batch_in_epoch"]:],
                                             collate_fn=B.collate, generator=torch.Generator())
        for batch in loader:
            state["batch_in_epoch"] += 1
            yield batch
        state["epoch"] += 1
        state["batch_in_epoch"] = 0


def with_features(run: Run, batch: dict) -> dict:
    """The batch on the device, with the target's features computed where no cache holds them (online mode, or a
    hybrid cache's first sight of a row, which is then cached)."""
    device = run.accelerator.device
    rows = batch.pop("rows", None)
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if "features" not in batch and not run.drafter.trains_target:
        batch["features"] = target_features(run.target, batch["input_ids"], batch["attention_mask"],
                                            run.drafter.feature_layers, batch.get("position_ids"))
        if rows is not None:
            store_batch(run.rows.features, batch, rows, batch["features"])
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
    model = acc.unwrap_model(run.module)  # no DDP wrapper: no gradient sync, no buffer broadcast
    stats = DepthStats()
    model.eval()
    batches = B.eval_batches(run.eval_idx, run.lengths, run.recipe.train.batch_size)
    mine = batches[acc.process_index::acc.num_processes]
    # FSDP and DeepSpeed gather weights inside forward, so every process must run as many forwards:
    # a process with fewer eval batches repeats one and discards its metrics.
    rounds = -(-len(batches) // acc.num_processes) if acc.distributed_type.value in ("FSDP", "DEEPSPEED") else len(mine)
    for i in range(rounds):
        batch = with_features(run, B.collate([run.rows[j] for j in (mine[i] if i < len(mine) else batches[0])]))
        loss, metrics = model(batch)
        if i < len(mine):
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
    recipe, acc, state = run.recipe, run.accelerator, run.state
    cfg = recipe.train
    final = run.run_dir / FINAL / DRAFTER
    budget = cfg.time_budget_minutes * 60 if cfg.time_budget_minutes else math.inf
    # a run stopped by its time budget is as finished as one that reached max_steps: run again, it would train one
    # more step past the budget and overwrite final/
    out_of_time = state["train_seconds"] > budget
    if (state["step"] >= cfg.max_steps or out_of_time) and final.is_dir():
        limit, raise_it = ((f"{cfg.time_budget_minutes:g} min", "train.time_budget_minutes") if out_of_time
                           else (f"{cfg.max_steps} steps", "train.max_steps"))
        acc.print(f"draftheads: {run.run_dir} has finished ({state['step']} of {cfg.max_steps} steps, "
                  f"{state['train_seconds'] / 60:.1f} min; drafter in {final}, limit {limit}); to train further "
                  f"raise {raise_it} and set train.resume={C.list_checkpoints(run.run_dir)[-1]}, or set "
                  "train.output_dir for a new run")
        return
    start_trackers(acc, recipe.log, recipe.name, recipe.to_dict())
    batches = micro_batches(run)
    window = DepthStats(state["window"])
    bar = tqdm(total=cfg.max_steps, initial=state["step"], desc=f"train {recipe.name}", unit="step",
               disable=not acc.is_main_process, dynamic_ncols=True)
    say = Say(acc)
    clock = Clock(state["train_seconds"])
    stopped_by = "max_steps"
    depth = len(state["history"][-1]["acc"]) if state["history"] else 0
    while state["step"] < cfg.max_steps:
        with clock.stepping():
            local = train_step(run, batches)
        out_of_time = acc.is_main_process and clock.total() > budget  # decided by one process, shared by gather
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
            log_window(run, window, clock, say)
            window = DepthStats()
        if step % cfg.eval_every == 0 or last:
            eval_and_keep_best(run, depth, say)
        state["window"], state["train_seconds"] = window.state(), clock.total()
        if step % cfg.save_every == 0 or last:
            save(run)
        if after_step is not None:
            after_step(step)
        if flag and step < cfg.max_steps:
            stopped_by = "time_budget"
            say.write(f"draftheads: the time budget ({cfg.time_budget_minutes:g} min) ran out after step {step} of "
                      f"{cfg.max_steps}; checkpoint saved, finishing now (raise train.time_budget_minutes to "
                      "train longer)")
            break
    bar.close()
    finish(run, stopped_by, depth, clock)


class Clock:
    """Wall time of the whole run (across resumes, for the budget) and of this session's training steps."""

    def __init__(self, earlier_seconds: float):
        self.earlier, self.start = earlier_seconds, time.perf_counter()
        self.step_seconds, self.window_seconds, self.tokens = 0.0, 0.0, 0

    def total(self) -> float:
        return self.earlier + time.perf_counter() - self.start

    @contextlib.contextmanager
    def stepping(self):
        """Time a training step (eval and checkpoints are left out of tokens/s)."""
        t = time.perf_counter()
        yield
        self.step_seconds += time.perf_counter() - t
        self.window_seconds += time.perf_counter() - t

    def tokens_per_second(self) -> float:
        return self.tokens / max(self.step_seconds, 1e-9)


def log_window(run: Run, window: DepthStats, clock: Clock, say) -> None:
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
    say.write(f"step {state['step']:>6} | loss {summary['loss']:.4f} | acc {accs} | accept {summary['accept_len']:.3f} "
              f"| lr {lr:.2e} | {rate:,.0f} tok/s")


def eval_and_keep_best(run: Run, depth: int, say) -> dict | None:
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
        drafter = exportable_drafter(run)
        if acc.is_main_process:
            write_folder(run.run_dir / BEST, lambda tmp: write_best(run, drafter, tmp, entry))
    acc.wait_for_everyone()
    accs = "/".join(f"{a:.3f}" for a in summary["acc"])
    say.write(f"eval {state['step']:>6} | loss {summary['loss']:.4f} | acc {accs} | accept {summary['accept_len']:.3f}"
              + (" | best" if better else f" | best {state['best_metric']:.3f} at step {state['best_step']}"))
    return entry


def write_best(run: Run, drafter, folder: Path, entry: dict) -> None:
    save_drafter(drafter, folder / DRAFTER, target=run.target, extra={"step": entry["step"], "eval": entry},
                 recipe=run.recipe.to_dict())
    C.write_json(folder / "metrics.json", entry)


def save(run: Run) -> Path:
    """Checkpoint the current step (all processes), then prune old ones (never the best)."""
    folder = C.save_checkpoint(run.accelerator, run.run_dir, run.state["step"], exportable_drafter(run), run.state,
                               run.recipe.to_dict(), run.scheduler, run.target)
    if run.accelerator.is_main_process:
        C.prune(run.run_dir, run.recipe.train.keep_last, protect=run.state["best_step"])
    run.accelerator.wait_for_everyone()
    return folder


def finish(run: Run, stopped_by: str, depth: int, clock: Clock) -> None:
    """final/drafter/ and final/metrics.json; print the held-out accuracy and the training throughput."""
    state, acc, cfg = run.state, run.accelerator, run.recipe.train
    final_eval = next((e for e in state["eval_history"] if e["step"] == state["step"]), None)
    if final_eval is None and depth and len(run.eval_idx):  # resumed a run that had already finished
        final_eval = eval_and_keep_best(run, depth, Say(acc))
    metrics = {
        "steps": state["step"], "max_steps": cfg.max_steps, "stopped_by": stopped_by, "mode": cfg.mode,
        "train_seconds": state["train_seconds"], "train_tokens_per_s": clock.tokens_per_second(),
        "final_eval": final_eval, "best_accept_len": state["best_metric"], "best_step": state["best_step"],
        "history": state["history"], "eval_history": state["eval_history"],
    }
    drafter = exportable_drafter(run)
    if acc.is_main_process:
        def build(tmp):
            save_drafter(drafter, tmp / DRAFTER, target=run.target, extra={"step": state["step"], "eval": final_eval},
                         recipe=run.recipe.to_dict())
            C.write_json(tmp / "metrics.json", metrics)
        write_folder(run.run_dir / FINAL, build)
    acc.wait_for_everyone()
    if final_eval is not None:
        acc.print(f"draftheads: held-out top-1 accuracy of depth 1: {final_eval['acc'][0]:.3f} "
                  f"(all depths {'/'.join(f'{a:.3f}' for a in final_eval['acc'])}; simulated acceptance length "
                  f"{final_eval['accept_len']:.3f}; best {state['best_metric']:.3f} at step {state['best_step']})")
    acc.print(f"draftheads: {cfg.mode} training: {clock.tokens_per_second():,.0f} tokens/s over {state['step']} steps "
              f"({stopped_by}); drafter in {run.run_dir / FINAL / DRAFTER}")


class Say:
    """Lines from the main process only, printed above the progress bar (tqdm.write writes from every process)."""

    def __init__(self, acc):
        self.acc = acc

    def write(self, text: str) -> None:
        if self.acc.is_main_process:
            tqdm.write(text)
