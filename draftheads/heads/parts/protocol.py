"""The methods of the drafter protocols (core/drafter.py) that every head would otherwise write again, written once.

They are functions a head's class takes as its own methods, not a base class to inherit from: the class still names
each method of the protocol, and the line that names it says where its body is.

    class EagleDrafter(nn.Module):
        from_target = classmethod(new_for_target)          # TrainableDrafter: cls(config, target_config)
        param_groups = one_param_group                     # TrainableDrafter: all trainable parameters at lr
        reset, observe, propose = drafting_methods(LayerDrafting)   # Drafter, forwarded to the generation's state

A head whose generation state is an object of its own (draft_layer.LayerDrafting, block_drafting.BlockDrafting,
P-EAGLE's ParallelDrafting) holds it as `_drafting`: reset makes a new one (so each row's `copy.copy` of the drafter
drafts with its own), observe and propose hand it the head, and propose its sampling settings as one `Sampling`.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import nn

from draftheads.core.drafter import Proposal
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.heads.parts.draft_tree import Sampling


class DraftingState(Protocol):
    """One generation's drafting state, e.g. a draft layer's KV cache over the committed positions."""

    def observe(self, model, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, F], the token after each [b, n]."""

    def propose(self, model, tree: Tree | DynamicTreeSpec, sampling: Sampling) -> Proposal:
        """Draft `tree` rooted at the pending token (one sequence)."""


def drafting_methods(new_state: Callable[[], DraftingState]) -> tuple[Callable, Callable, Callable]:
    """(reset, observe, propose): core/drafter.py's Drafter for a head whose generation state is `new_state()`."""

    def reset(self) -> None:
        """Forget the generation: a new state."""
        self._drafting = new_state()

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append committed positions: features [b, n, F], the token after each [b, n]."""
        self._drafting.observe(self, features, next_tokens)

    def propose(self, tree: Tree | DynamicTreeSpec, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> Proposal:
        """Draft `tree` rooted at the pending token (one sequence), as the state's propose does."""
        return self._drafting.propose(self, tree, Sampling(temperature, top_k, top_p, generator))

    return reset, observe, propose


def new_for_target(cls, target_config, config):
    """TrainableDrafter's from_target, as classmethod(new_for_target): the head built as cls(config, target_config)."""
    return cls(config, target_config)


def one_param_group(drafter: nn.Module, lr: float) -> list[dict]:
    """TrainableDrafter's param_groups for a head trained at one rate: all its trainable parameters at `lr`."""
    return [{"params": trainable(drafter), "lr": lr}]


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of `module` that train (requires_grad)."""
    return [p for p in module.parameters() if p.requires_grad]
