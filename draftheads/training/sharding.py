"""FSDP2 for draftheads: the drafter sharded by Accelerate, and optionally the frozen target's layers too.

    accelerate launch --config_file draftheads/recipes/accelerate/fsdp.yaml -m draftheads.train RECIPE \
        train.shard_target=true

The drafter is prepared by Accelerate's own FSDP2 path (fully_shard, gathered state dicts, save_state).
With train.shard_target the target's decoder layers are fully_shard-ed too, forward-only: each layer's
weights are all-gathered for its forward and freed after it, so the target's memory per process falls
with the process count (no gradients, no optimizer state: it is frozen). Its embedding, final norm and
lm_head stay whole on every process, because the drafter calls them directly, outside the target's
forward, where no FSDP hook would gather them; for a Llama-70B target that is 4.2 of 141 GB in bf16.

A sharded target needs every process to run the same number of target forwards (each one is a
collective); the training loop's batches, its evaluation rounds and the feature cache builder keep that.
"""

from __future__ import annotations

import os

import torch
from accelerate.state import PartialState
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from draftheads.core.errors import DraftheadsError


def keep_fsdp_on_cpu(accelerator, precision: str) -> None:
    """Run Accelerate's FSDP path on CPU processes when the launcher asked for FSDP.

    Accelerate turns every multi-process CPU launch into plain DDP (MULTI_CPU) and drops the FSDP
    plugin, although torch's FSDP2 runs on CPU over gloo. The plugin is rebuilt from the launcher's
    environment exactly as Accelerate builds it on GPUs, so the same prepare/save/load code runs here
    as on a cluster, which is the point of executing it on CPU at all.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true" or accelerator.num_processes < 2:
        return
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()
    if precision != "no":  # as Accelerate does: without mixed precision the plugin keeps the weights' dtype
        plugin.set_mixed_precision(precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    # AcceleratorState() re-reads the process state each time it is created: both must say FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def check_fsdp_checkpoints(accelerator) -> None:
    """Refuse FSDP's sharded checkpoints: torch.distributed.checkpoint unpickles their metadata on resume."""
    if accelerator.distributed_type != DistributedType.FSDP:
        return
    kind = accelerator.state.fsdp_plugin.state_dict_type
    if getattr(kind, "name", str(kind)) != "FULL_STATE_DICT":
        raise DraftheadsError(f"fsdp_state_dict_type {getattr(kind, 'name', kind)} writes checkpoints whose metadata "
                              "is unpickled on resume (unpickling can run code); set fsdp_state_dict_type: "
                              "FULL_STATE_DICT in the accelerate config, as recipes/accelerate/fsdp.yaml does")


def decoder_layers(target) -> torch.nn.ModuleList:
    """The target's stack of decoder layers (the part a sharded target splits over processes)."""
    base = target.get_base_model() if hasattr(target, "get_base_model") else target
    layers = getattr(base.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise DraftheadsError(f"train.shard_target: {type(base).__name__} keeps no decoder.layers list to shard; set "
                              "train.shard_target=false")
    return layers


def shard_target(target, accelerator) -> None:
    """fully_shard each decoder layer of the frozen target over all processes (forward-only)."""
    if accelerator.distributed_type != DistributedType.FSDP:
        raise DraftheadsError("train.shard_target needs an FSDP launch (accelerate launch --config_file "
                              "draftheads/recipes/accelerate/fsdp.yaml ...); set train.shard_target=false otherwise")
    mesh = init_device_mesh(accelerator.device.type, (accelerator.num_processes,))
    for layer in decoder_layers(target):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)


def is_sharded(target) -> bool:
    """Whether the target's layers are FSDP-sharded (its forwards are then collectives)."""
    return any(isinstance(m, FSDPModule) for m in target.modules())


def local_bytes(model) -> int:
    """Bytes of the model's parameters and buffers held by this process (a sharded tensor counts its shard)."""
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def whole_bytes(model) -> int:
    """Bytes of the model's parameters and buffers, whole."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
