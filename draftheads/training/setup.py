"""Everything the training loop needs, built once: accelerator, target, drafter, rows, optimizer, schedule.

`setup` returns a `Run`; the loop in loop.py reads it top to bottom. Resuming happens here too:
weights, optimizer and RNG come back through accelerator.load_state, the LR schedule from its JSON,
the data position and logged history through the trainer state (training/checkpoint.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DistributedType, ProjectConfiguration, set_seed
from datasets import concatenate_datasets

from draftheads.core.drafter import TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import COMPLETE, incomplete_checkpoints
from draftheads.core.writable import check_writable
from draftheads.data.datastore import COLUMNS, PROMPT_ID, check_mode, load_rows, prompt_groups, read_meta
from draftheads.data.hardware import check_cpu_launch, resolve_device, resolve_dtype
from draftheads.data.target import load_target, load_target_config
from draftheads.heads.factory import bound_drafter, drafter_class, new_drafter
from draftheads.heads.parts.objective import attach_objective
from draftheads.heads.parts.target_init import init_from_target
from draftheads.interop.assistant_folder import shipped_assistant
from draftheads.interop.load import load_drafter
from draftheads.interop.shipped_mtp import shipped_drafter
from draftheads.interop.vocab_mapping import read_vocab_mapping
from draftheads.training import batches as B
from draftheads.training import checkpoint as C
from draftheads.training.deepspeed_support import (cpu_process_state, deepspeed_launch, keep_target_whole,
                                                   read_checkpoints_safely, zero_stage)
from draftheads.training.features import build_feature_cache, cache_key, feature_dim
from draftheads.training.hybrid_cache import open_hybrid_cache
from draftheads.training.sharding import (check_fsdp_checkpoints, keep_fsdp_on_cpu, local_bytes, shard_target,
                                          whole_bytes)
from draftheads.training.trackers import check_trackers, prepare_environment


class DraftLoss(torch.nn.Module):
    """Routes forward() to drafter.training_loss, so DDP/FSDP wrappers see a normal forward call."""

    def __init__(self, drafter: TrainableDrafter):
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: dict):
        return self.drafter.training_loss(batch)

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """What training changes, for accelerate's checkpoints: never a frozen parameter. A Medusa-2 drafter
        holds its whole target (a submodule under the LoRA adapter), whose frozen weights come from the
        target on resume and would otherwise be copied into every checkpoint (14 GB each for a 7B target)."""
        state = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        for key in self.frozen_keys(prefix) & state.keys():
            del state[key]
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Loads a checkpoint written by `state_dict`: the frozen weights it leaves out are not missing."""
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        frozen = self.frozen_keys()
        result.missing_keys[:] = [k for k in result.missing_keys if k not in frozen]
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(f"checkpoint does not fit the drafter: missing {result.missing_keys[:3]}, "
                               f"unexpected {result.unexpected_keys[:3]}")
        return result

    def frozen_keys(self, prefix: str = "") -> set[str]:
        """State-dict keys of parameters that do not train (the target's, inside a Medusa-2 drafter)."""
        return {prefix + name for name, p in self.named_parameters() if not p.requires_grad}


@dataclass
class Run:
    """Everything the loop needs, built once by `setup`."""

    recipe: object
    accelerator: object
    target: torch.nn.Module
    drafter: TrainableDrafter
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



def release_accelerate_state() -> None:
    """Let a later run_training in this process pick its own precision and accumulation (Accelerate keeps
    them in process-wide singletons); the process group itself (PartialState) stays."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def make_accelerator(recipe):
    cfg = recipe.train
    check_cpu_launch("train")
    device = resolve_device(recipe.target.device)  # cuda asked for without a GPU would train on the CPU, silently
    check_trackers(recipe.log.trackers)
    check_output_locations(recipe)
    run_dir = recipe.run_dir
    prepare_environment(recipe.log, run_dir)
    # 'auto' on a machine without a GPU is the CPU too: told nothing, Accelerate would start each launched process
    # as a run of its own (N copies writing one run folder) instead of joining them over gloo
    cpu = device.type == "cpu"
    deepspeed_on_cpu = cpu and deepspeed_launch()
    if deepspeed_on_cpu:
        cpu_process_state()
    dtype = resolve_dtype(cfg.dtype, PartialState(cpu=cpu).device)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "no")
    accelerator = Accelerator(
        cpu=cpu and not deepspeed_on_cpu,  # cpu=True would turn DeepSpeed off (training/deepspeed_support.py)
        mixed_precision=precision,
        gradient_accumulation_steps=cfg.grad_accum,
        log_with=list(recipe.log.trackers) or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
    )
    keep_fsdp_on_cpu(accelerator, precision)  # CPU processes only (target.device cpu, or auto without a GPU)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        keep_target_whole()
    check_fsdp_checkpoints(accelerator)
    return accelerator


def check_output_locations(recipe) -> None:
    """The run folder, and a feature cache train.feature_cache places, must take files before the target loads: found
    later, they end the run at its first checkpoint (or the cache's first shard) with a traceback."""
    cfg = recipe.train
    check_writable(recipe.run_dir, "train.output_dir")
    cache = Path(cfg.feature_cache) if cfg.feature_cache else None
    # a complete offline cache is only read (it may sit on a read-only share); a hybrid cache is written as it goes
    if cache and (cfg.mode == "hybrid" or cfg.mode == "offline" and not (cache / "manifest.json").is_file()):
        check_writable(cache, "train.feature_cache")


def setup(recipe, accelerator, target=None, drafter=None) -> Run:
    """Target, drafter, data, optimizer and schedule, prepared; state restored from a checkpoint if resuming."""
    cfg = recipe.train
    if cfg.mode != "online" and drafter_class(recipe.head).trains_target:
        raise DraftheadsError("head.type medusa2 trains LoRA on the target, so it cannot use cached features; set "
                              "train.mode=online")
    if cfg.mode == "hybrid" and cfg.shard_target:
        raise DraftheadsError("train.mode=hybrid computes features only for rows not cached yet, but a sharded "
                              "target needs every process to run the same forwards; use train.mode=offline with "
                              "train.shard_target")
    rows = training_rows(recipe)  # read and cut to train.max_length before the target loads: refusals come first
    lengths = B.row_lengths(rows, cfg.max_length)
    train_idx, eval_idx = split_answered(recipe, rows, accelerator)
    recipe.resolve(_target_config(recipe, target))   # a head this family cannot carry: refused before it loads
    model = _target_model(recipe, accelerator, target)
    recipe.resolve(model.config)
    place_target(recipe, accelerator, model)
    set_seed(cfg.seed)  # the drafter's initial weights depend on the seed only
    if drafter is None:
        drafter = initial_drafter(recipe, model, rows, train_idx)
    attach_objective(drafter, cfg.loss, cfg.depth_weights)  # train.loss / train.depth_weights, or refused here
    drafter.to(device=accelerator.device, dtype=torch.float32)  # fp32 master weights; autocast does bf16/fp16
    rowset = make_rowset(recipe, accelerator, model, drafter, rows, lengths)
    optimizer = make_optimizer(drafter, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.warmup_steps, cfg.max_steps,
                                                                                 cfg.schedule))
    configure_backend(accelerator, cfg)
    module, optimizer = accelerator.prepare(DraftLoss(drafter), optimizer)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        read_checkpoints_safely(module)
    # the scheduler is saved as JSON by training/checkpoint.py: registered with accelerate it would be pickled
    set_seed(cfg.seed + accelerator.process_index)  # per-process noise (EAGLE input noise, dropout)
    run = Run(recipe, accelerator, model, drafter, module, optimizer, scheduler, rowset, lengths, train_idx, eval_idx,
              new_state(), recipe.run_dir)
    resume(run)
    return run


def training_rows(recipe):
    """data.output's rows, then train.more_data's, each folder checked by load_rows; all made for one target."""
    folders = [recipe.data_dir, *(Path(f) for f in recipe.train.more_data)]
    for folder in folders[1:]:
        if not folder.exists():
            raise DraftheadsError(f"train.more_data: '{folder}' not found; make it first (`draftheads data RECIPE` of "
                                  "the recipe whose data.output it is) or drop it from train.more_data")
    parts = [load_rows(folder) for folder in folders]
    for folder in folders:
        check_mode(folder, recipe.data.mode)
    if len(parts) == 1:
        return parts[0]
    targets = {folder: data_target(folder) for folder in folders}
    first = targets[recipe.data_dir]
    for folder, target in targets.items():
        if first and target and target != first:
            raise DraftheadsError(f"train.more_data: '{folder}' was generated by target {target}, data.output "
                                  f"'{recipe.data_dir}' by {first}; train on data of one target, or drop '{folder}'")

    # plain format to concatenate, then the numpy view load_rows gives; the old rows keep their places (and shards)
    # prompt_id too, where every folder has it: a folder of the same prompts answered again is grouped with them
    kept = [*COLUMNS, PROMPT_ID] if all(PROMPT_ID in part.column_names for part in parts) else list(COLUMNS)
    rows = concatenate_datasets([part.with_format(None).select_columns(kept) for part in parts])
    return rows.with_format("numpy", columns=list(COLUMNS))


def split_answered(recipe, rows, accelerator) -> tuple[np.ndarray, np.ndarray]:
    """(train, eval) indices of the rows with an answer token left once cut to train.max_length. A row without one
    adds no loss, and a batch of only such rows leaves nothing to backpropagate: they are left out with a note, and
    refused in one line when no row is left."""
    cfg = recipe.train
    kept = B.answered_rows(rows, cfg.max_length, "train.max_length", accelerator.print, "training rows")
    groups = prompt_groups(rows)
    train, held = B.split_rows(len(kept), cfg.eval_fraction, cfg.seed, None if groups is None else groups[kept])
    return kept[train], kept[held]  # every row kept: the split of all rows, as before


def data_target(folder: Path) -> str | None:
    """The target (name@revision) a data folder's metadata says wrote it; None where it says nothing."""
    target = read_meta(folder).get("target")
    return f"{target.get('name')}@{target.get('revision') or 'main'}" if isinstance(target, dict) else None


def _target_config(recipe, target):
    """The target's transformers config: the given model's, or read from its files without the weights."""
    if target is not None:
        return (target[0] if isinstance(target, (tuple, list)) else target).config
    t = recipe.target
    return load_target_config(t.name, t.revision, t.trust_remote_code)


def _target_model(recipe, accelerator, target):
    if target is not None:
        model = target[0] if isinstance(target, (tuple, list)) else target
        return model.to(accelerator.device)
    t = recipe.target
    # 'auto' is resolved by load_target, which loads a quantized GGUF in fp32 (bf16 would cast every matmul)
    dtype = "auto" if recipe.train.dtype == "auto" else resolve_dtype(recipe.train.dtype, accelerator.device)
    model, _ = load_target(t.name, dtype=dtype,
                           device=str(accelerator.device), revision=t.revision, trust_remote_code=t.trust_remote_code,
                           chat_template=t.chat_template, attn_implementation=t.attn_implementation,
                           mode=recipe.data.mode)
    return model


def place_target(recipe, accelerator, model) -> None:
    """Shard the frozen target's layers when the recipe asks (FSDP only); say what it takes per process."""
    if recipe.train.shard_target:
        if drafter_class(recipe.head).trains_target:
            raise DraftheadsError("train.shard_target: head.type medusa2 trains LoRA on the target, which FSDP would "
                                  "then have to train sharded; set train.shard_target=false")
        shard_target(model, accelerator)
    if accelerator.num_processes > 1:
        mine, whole = local_bytes(model) / 2**20, whole_bytes(model) / 2**20
        how = (f"its decoder layers sharded over {accelerator.num_processes} processes" if recipe.train.shard_target
               else "whole on every process; train.shard_target=true shards its layers under FSDP")
        accelerator.print(f"draftheads: target weights per process: {mine:,.1f} MiB of {whole:,.1f} MiB ({how})")


def initial_drafter(recipe, model, rows, train_idx):
    """A new drafter from recipe.head (with a draft vocabulary: the most frequent trained tokens), or
    head.init_from's."""
    head = recipe.head
    if head.init_from:
        drafter = load_drafter(head.init_from, model)
        if drafter.config.type != head.type:
            raise DraftheadsError(f"head.init_from '{head.init_from}' holds a {drafter.config.type} drafter but "
                                  f"head.type is {head.type}")
        return drafter
    # the drafter the target ships (its checkpoint's MTP layers, Gemma 4's assistant folder), as shipped
    shipped = {"native": shipped_drafter, "assistant": shipped_assistant}.get(head.type)
    drafter = shipped(model, head) if shipped else bound_drafter(head, model)
    if getattr(head, "init", "random") == "target_layer":
        left = init_from_target(drafter, model)
        if left:
            PartialState().print(f"draftheads: head.init: target_layer left {len(left)} draft-layer tensors with no "
                                 f"counterpart in the target at their fresh init ({', '.join(left[:4])}"
                                 f"{', ...' if len(left) > 4 else ''})")
    vocab = recipe.derived["vocab_size"]
    if recipe.train.draft_vocab_from:
        if not drafter.vocab.restricted:
            raise DraftheadsError("train.draft_vocab_from needs a drafter with a draft vocabulary; set "
                                  "head.draft_vocab_size")
        chosen = read_vocab_mapping(recipe.train.draft_vocab_from, vocab)
        if len(chosen) != drafter.vocab.size:
            raise DraftheadsError(f"train.draft_vocab_from holds {len(chosen)} tokens but head.draft_vocab_size is "
                                  f"{drafter.vocab.size}; set head.draft_vocab_size: {len(chosen)}")
        # exactly these tokens: each counted once, every other token never
        drafter.set_draft_vocab(torch.zeros(vocab, dtype=torch.long).index_fill(0, chosen, 1))
    elif drafter.vocab.restricted:
        drafter.set_draft_vocab(B.loss_token_counts(rows, train_idx, recipe.train.max_length, vocab))
    return drafter


def make_rowset(recipe, accelerator, model, drafter, rows, lengths) -> B.RowSet:
    """Rows as tensors; in offline mode with the feature cache attached (built first if missing)."""
    cfg = recipe.train
    if cfg.mode == "online":
        return B.RowSet(rows, cfg.max_length)
    if drafter.trains_target:
        raise DraftheadsError("this drafter trains the target itself (Medusa-2: LoRA on the target), so it cannot use "
                              "cached features; set train.mode=online")
    layers = tuple(drafter.feature_layers)
    key = cache_key(model, layers, cfg.max_length, cfg.feature_dtype, rows, lengths)
    if cfg.mode == "hybrid":
        folder = Path(cfg.feature_cache) if cfg.feature_cache else recipe.data_dir / "features" / f"hybrid-{key}"
        cache = open_hybrid_cache(accelerator, folder, cfg.feature_dtype, feature_dim(model, layers),
                                  int(lengths.sum()), cfg.feature_cache_max_gb)
        return B.RowSet(rows, cfg.max_length, cache)
    folder = Path(cfg.feature_cache) if cfg.feature_cache else recipe.data_dir / "features" / key
    cache = build_feature_cache(accelerator, model, B.RowSet(rows, cfg.max_length), lengths, layers, folder,
                                cfg.feature_dtype, cfg.batch_size, share_folder=not cfg.feature_cache,
                                keep_earlier=bool(cfg.more_data))
    if (not np.array_equal(cache.lengths, lengths)
            or cache.dim != feature_dim(model, layers)):
        raise DraftheadsError(f"feature cache {folder} was built for other data or feature layers; delete it or set "
                              "train.feature_cache elsewhere")
    return B.RowSet(rows, cfg.max_length, cache)


def make_optimizer(drafter, cfg) -> torch.optim.Optimizer:
    groups = drafter.param_groups(cfg.lr)
    if not any(p.requires_grad for g in groups for p in g["params"]):
        raise DraftheadsError("the drafter has no trainable parameters; check the head configuration")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the base LR at optimizer step `step` (0-based): linear warm-up, then cosine/linear/constant
    to 0."""
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
    for folder in incomplete_checkpoints(run.run_dir):
        acc.print(f"draftheads: skipping half-written checkpoint {folder} (no {COMPLETE} marker)")
    folder = C.find_resume(run.run_dir, cfg.resume, warn=acc.print)
    if folder is None:
        return
    if cfg.resume == "auto":  # an explicit train.resume is a deliberate continuation, new settings and all
        C.check_same_settings(folder, run.recipe.to_dict(), run.recipe.defaults())
    run.state = C.load_checkpoint(acc, folder, run.scheduler)
    acc.print(f"draftheads: resuming from {folder} (step {run.state['step']})")


def configure_backend(accelerator, cfg) -> None:
    """The recipe decides accumulation (a launcher's env var would override the Accelerator argument), and
    DeepSpeed, which reads micro-batch size, accumulation and clipping from its own config, gets the recipe's."""
    accelerator.gradient_accumulation_steps = cfg.grad_accum
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        plugin.deepspeed_config.update(train_micro_batch_size_per_gpu=cfg.batch_size,
                                       gradient_accumulation_steps=cfg.grad_accum,
                                       gradient_clipping=cfg.max_grad_norm or 0.0)


def exportable_drafter(run: Run):
    """The drafter with whole weights for save_drafter (main process; None elsewhere). Every process must call it:
    under FSDP and ZeRO-3 the weights are sharded, so a full state dict is gathered into a fresh, unsharded copy."""
    acc = run.accelerator
    if acc.distributed_type != DistributedType.FSDP and zero_stage(acc) < 3:
        return run.drafter if acc.is_main_process else None
    state = acc.get_state_dict(run.module)  # full tensors, on the main process only
    if not acc.is_main_process:
        return None
    copy = new_drafter(run.drafter.config, run.target.config).bind(run.target)
    copy.load_state_dict({k.removeprefix("drafter."): v for k, v in state.items()}, strict=False)
    return copy
