"""DeepSpeed ZeRO under draftheads: launched on CPU processes too, the frozen target kept whole, checkpoints read
without unpickling code.

    accelerate launch --config_file draftheads/recipes/accelerate/deepspeed_zero2.yaml -m draftheads.train RECIPE

Three things Accelerate and DeepSpeed do not do for us:
- On a machine without a GPU Accelerate finds no process-group backend and switches DeepSpeed off (plain DDP, told
  nothing). DeepSpeed's own CPU accelerator runs over gloo, so a CPU launch gets Accelerate's process state with
  that backend: the same DeepSpeed engine then runs here as on a cluster (it compiles one small C++ op, the shared-
  memory collectives, with the system's g++ on first use).
- Under ZeRO-3 Accelerate registers DeepSpeed's config with transformers, which then loads every model partitioned
  (zero.Init), the frozen target included; the drafter calls the target's embedding and lm_head directly, so the
  target is loaded whole.
- DeepSpeed reads its checkpoints with torch.load(weights_only=False), i.e. it unpickles them as code. The engine's
  checkpoint reader is replaced by one that loads with weights_only=True, allowing only the few plain DeepSpeed
  data classes its files hold.
"""

from __future__ import annotations

import os

import torch
from accelerate import PartialState
from transformers.integrations.deepspeed import unset_hf_deepspeed_config


def deepspeed_launch() -> bool:
    """Whether `accelerate launch` asked for DeepSpeed."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def cpu_process_state() -> None:
    """Accelerate's process state for a DeepSpeed launch on CPU processes: gloo, as DeepSpeed's CPU accelerator uses."""
    PartialState(cpu=False, backend="gloo")


def keep_target_whole() -> None:
    """Let transformers load the frozen target unpartitioned under ZeRO-3 (see the module docstring)."""
    unset_hf_deepspeed_config()


def zero_stage(accelerator) -> int:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return int(plugin.zero_stage) if plugin is not None else 0


def read_checkpoints_safely(module) -> None:
    """Give the prepared DeepSpeed engine a checkpoint reader that does not unpickle code."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    class PlainTensorsCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            with torch.serialization.safe_globals(_deepspeed_data_classes()):
                return torch.load(path, map_location=map_location, weights_only=True)

    module.checkpoint_engine = PlainTensorsCheckpointEngine(getattr(module.checkpoint_engine, "config_params", None))


def _deepspeed_data_classes() -> list:
    """The non-tensor classes in DeepSpeed's model and optimizer state files: plain records and enums."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]
