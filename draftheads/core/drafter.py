"""The interfaces drafters offer (Protocols, not base classes): `Drafter` to the generation loop,
`TrainableDrafter` to training, checkpoints and the drafter file formats, and `DraftLayer` (the EAGLE heads' two
ends of their draft layer) to the code that runs that layer.

The loop keeps the target's KV cache holding every committed token except the newest one,
the *pending* token (sampled from the target but not yet fed to it). Each step:

    proposal = drafter.propose(tree, temperature=..., top_k=..., top_p=..., generator=...)
    # proposal.tokens[:, 0] is the pending token (the root); nodes 1.. are drafts
    verify with one target forward over proposal.tokens, accept a path, sample the next pending token
    drafter.observe(features_of_committed_nodes, next_tokens)

`observe` receives, for the n positions newly committed to the target's cache, the target's
features there [b, n, F] (the hidden states listed in `feature_layers`, concatenated on the last
axis) and the token that follows each position [b, n] (the last of which is the new pending
token). After the prompt's prefill that is every prompt position. A drafter with its own KV
cache (EAGLE, MTP) drops whatever it cached while drafting before taking the new positions in.

Prompt lookup is a Drafter only; the learned heads (heads/) are TrainableDrafters as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from draftheads.core.tree import DynamicTreeSpec, Tree


@dataclass
class Proposal:
    """Candidate tokens arranged as a tree rooted at the pending token, for one sequence (the loop asks each row's
    drafter for its own proposal).

    tree:   the shape (static as given, or built by the drafter for a dynamic spec; a drafter may return a
            sub-tree of a static one, e.g. prompt lookup where it found nothing)
    tokens: [1, N] token at each of the tree's N nodes; column 0 is the root (the pending token)
    q:      [1, N, V] the draft distribution each node's children were drawn from, when they were
            sampled without replacement from it (in rank order); None when children are the
            deterministic top-k of the draft (the acceptance rules handle both exactly).
            V is the target's vocabulary. Give q only if each node's children are exactly its first
            m draws, with m fixed before drawing: pruning children by their drawn values (e.g. an
            EAGLE-2 dynamic tree keeping the best nodes by score) biases the strict rule when q is
            given. Return q=None then: the point-mass rule (accept child x with the residual's
            probability of x, else zero x) is exact however the distinct children were chosen.
    """

    tree: Tree
    tokens: torch.Tensor
    q: torch.Tensor | None = None


@runtime_checkable
class Drafter(Protocol):
    # Indices into the target's `hidden_states` tuple the drafter reads; -1 is the last one
    # (after the final norm, the lm_head input). Concatenated in this order.
    feature_layers: tuple[int, ...]
    # The tree drafted when the caller gives none, parsed when the drafter is built.
    default_tree: Tree | DynamicTreeSpec

    def reset(self) -> None:
        """Forget all state (a new prompt follows).

        The state a generation builds lives in attributes reset() replaces: each row of a batch drafts with
        its own `copy.copy` of the drafter, sharing its weights (drafters made of parts define __copy__)."""

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Take in newly committed positions: features [b, n, F], following tokens [b, n]."""

    def propose(
        self,
        tree: Tree | DynamicTreeSpec,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        """Draft a tree rooted at the pending token (the last `next_tokens` observed), of the shape `tree` asks for
        (parsed by the caller: decoding/generate.py once per generation).

        With a generator and temperature > 0 children may be sampled without replacement from the
        warped draft distribution (return it in `q`); otherwise take the top-k.
        """


@runtime_checkable
class TrainableDrafter(Drafter, Protocol):
    """A drafter with weights: what training (training/), checkpoints and the drafter formats (interop/) use.

    Built by heads/factory.py from its config and the target's, then bound to the target's frozen
    shared modules (embedding, lm_head, rotary embedding), which it never registers as its own.
    """

    config: Any  # the head's config dataclass, saved as config.json's "head"
    hidden_size: int  # the target sizes it was built for
    vocab_size: int
    vocab: Any  # heads/parts/draft_vocab.py: DraftVocabulary (restricted) or FullVocabulary
    trains_target: bool  # Medusa-2: the loss runs the LoRA-adapted target itself, so no cached features
    files: Any  # heads/parts/files.py: which module the weights file holds, and what is saved beside it

    def bind(self, target) -> "TrainableDrafter":
        """Attach the target's frozen shared modules (and anything of the target it trains); returns self."""

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """(loss, metrics): metrics holds per-depth "correct", "total", "loss_sum" [D] (training/metrics.py)."""

    def param_groups(self, lr: float) -> list[dict]:
        """AdamW parameter groups at the base learning rate `lr`."""

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the vocab.size tokens most frequent in token_counts [V] (a restricted vocab only)."""


class DraftLayer(Protocol):
    """What an autoregressive draft-layer drafter (EAGLE-1/2, EAGLE-3, P-EAGLE) gives the code that runs its layer
    (heads/parts/draft_layer.py: the training-time test and tree drafting): its two ends, and the loss a position
    adds to the token loss. The "carry" at position t is what the layer continues from: made from the target's
    features at first, then the layer's own previous output."""

    config: Any  # EagleConfig or Eagle3Config: ttt_steps, ttt_decay, input_noise, token_loss_fraction
    vocab: Any  # heads/parts/draft_vocab.py
    hidden_size: int
    dtype: torch.dtype
    training: bool

    def initial_carry(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [b, n, F] -> carry [b, n, H]."""

    def forward_layer(self, carry, tokens, position_ids, visible, cache=None) -> torch.Tensor:
        """carry [b, n, H], tokens [b, n] (x_{t+1} at position t) -> layer output [b, n, H]."""

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> fp32 logits over the drafter's vocabulary [..., V or Vd]."""

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's final features [..., H] -> its fp32 logits over the same columns."""

    def position_loss(self, token_loss: torch.Tensor, rows: torch.Tensor, target_f: torch.Tensor) -> torch.Tensor:
        """Per-position loss [m'] from the token loss [m'] of the picked positions, given every counted
        position's layer output and the target feature it should predict ([m, H] each)."""
