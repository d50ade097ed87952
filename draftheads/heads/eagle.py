"""EAGLE-1/2 — Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", and "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees".

[emb(x_{t+1}); f_t] [b, s, 2H] -> fc -> decoder layer (no input norm) -> f̂_{t+1} -> target lm_head

The decoder layer is the target's own class (heads/parts/layers.py), run autoregressively on its own
outputs (heads/parts/draft_layer.py: the training-time test and tree drafting). Loss per unroll step j:
feature_loss_weight · SmoothL1(f̂, f) + token_loss_weight · soft CE against the target's
distribution softmax(lm_head(f_{t+1})) (not the sampled next token), weighted ttt_decay^j.
EAGLE-3 (`type: eagle3`) is heads/eagle3.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.target_family import layer_rotary
from draftheads.core.tree import parse_tree
from draftheads.heads.parts import draft_layer
from draftheads.heads.parts.common import bind_frozen
from draftheads.heads.parts.draft_layer import MAX_TTT_STEPS, LayerDrafting, TttMode, check_unroll, ttt_mode_setting
from draftheads.heads.parts.draft_vocab import check_draft_vocab, vocabulary
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.layers import bind_parts, build_decoder_layer, run_layer
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import drafting_methods, new_for_target, one_param_group


@dataclass
class EagleConfig:
    """EAGLE-1/2 layer hyper-parameters (hidden size, vocabulary and layer count come from the target)."""

    type: Literal["eagle"] = doc("eagle", "head type")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens, "
                                             "through the rows of the target's lm_head for them (default: the full "
                                             "vocabulary), making each draft step several times cheaper")
    ttt_steps: int = doc(1, "training-time test: unroll this many steps on the drafter's own outputs")
    ttt_decay: float = doc(0.8, "training-time test: step j's loss is weighted decay^j")
    ttt_mode: TttMode = ttt_mode_setting()
    feature_loss_weight: float = doc(1.0, "weight of SmoothL1(f̂, f)")
    token_loss_weight: float = doc(0.1, "weight of the token cross-entropy")
    input_noise: float = doc(0.2, "width of the uniform noise added to input features during training (0 = off)")
    token_loss_fraction: float = doc(1.0, "share of positions, drawn anew each training step, that get the "
                                          "vocabulary-sized token loss (the feature loss uses all); < 1 trades a "
                                          "noisier token loss for speed")
    default_tree: str = doc("dynamic:8,6,48",
                            "tree used when the caller gives none (chain:K, dynamic:TOPK,DEPTH,TOTAL)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check_unroll(self)
        check(self.token_loss_weight >= 0 and self.feature_loss_weight >= 0, "head loss weights must be >= 0")
        # EAGLE-1's layer maps the target's normalised last features to the next ones; a target layer writes on the
        # residual stream's scale instead (the demo's SmolLM2 loss at step 10: 2,140 from a copy, 3.1 from random)
        check(self.init == "random", "head.init: target_layer does not apply to head.type eagle, whose layer maps "
                                     "the target's normalised features (a copied target layer writes on the residual "
                                     "stream's scale); use head.init: random, or head.type: eagle3")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Check what depends on the target."""
        check_draft_vocab(self.draft_vocab_size, vocab_size)

    @property
    def depth(self) -> int:
        return MAX_TTT_STEPS  # autoregressive: any draft depth


class EagleDrafter(nn.Module):
    """EAGLE-1/2: fc([emb(x_{t+1}); f_t]) into one decoder layer of the target's class, whose output
    predicts the target's next feature f_{t+1} and, through the target's lm_head, the next token.

    The carry at position t is the feature f_t: the target's at first, then the layer's own output.
    With a draft vocabulary the lm_head's rows for it draft (no weights of its own: the choice can
    be made after training too).
    """

    trains_target = False

    def __init__(self, config: EagleConfig, target_config):
        super().__init__()
        dims = target_dims(target_config)
        self.config = config
        self.hidden_size, self.vocab_size = dims.hidden_size, dims.vocab_size
        self.layer = build_decoder_layer(target_config)
        self.feature_layers = (-1,)
        self.fc = nn.Linear(2 * dims.hidden_size, dims.hidden_size, bias=True)
        if hasattr(self.layer, "input_layernorm"):  # post-norm families (OLMo 2) have none to drop
            self.layer.input_layernorm = nn.Identity()  # f is already normalised by the target
        self.vocab = vocabulary(self, config.draft_vocab_size, dims.vocab_size)
        self.default_tree = parse_tree(config.default_tree)
        self.files = WeightsOnly(self)
        bind_frozen(self, _lm_head=None)
        self.reset()

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    def bind(self, target) -> "EagleDrafter":
        """Share the target's frozen embedding, lm_head and rotary embedding (never trained or saved)."""
        bind_parts(self, target, "EAGLE", ("embed", "lm_head"), rotary=layer_rotary(self.layer))
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def draft_layers(self) -> list[nn.Module]:
        """The decoder layer head.init: target_layer copies the target's last layer into."""
        return [self.layer]

    def fusion_inputs(self) -> list[tuple[nn.Linear, int]]:
        """fc over [emb; feature] and where the feature's columns start (head.init: target_layer)."""
        return [(self.fc, self.hidden_size)]

    # ---- the two ends of the layer (heads/parts/draft_layer.py) ------------------------------

    def initial_carry(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, n, F] -> carry [b, n, H]: the target's last hidden state."""
        return features[..., -self.hidden_size :]

    def forward_layer(self, carry, tokens, position_ids, visible, cache=None) -> torch.Tensor:
        """carry [b, n, H], tokens [b, n] (x_{t+1} at position t) -> layer output f̂ [b, n, H]."""
        emb = self._embed(tokens).to(carry.dtype)
        hidden = self.fc(torch.cat([emb, carry], dim=-1))
        return run_layer(self.layer, self._rotary, hidden, position_ids, visible, cache)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """f̂ [..., H] -> fp32 logits through the target's lm_head: [..., V], or [..., Vd] (its rows for the draft
        vocabulary)."""
        return self.vocab.project(self._bound_lm_head(), out)

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's own logits from its final features [..., H], over the same columns as draft_logits."""
        return self.vocab.project(self._bound_lm_head(), features)

    def vocab_logits(self, out: torch.Tensor) -> torch.Tensor:
        """f̂ [..., H] -> [..., V] over the target vocabulary (-inf outside a draft vocabulary)."""
        return self.vocab.widen(self.draft_logits(out))

    def position_loss(self, token_loss: torch.Tensor, rows: torch.Tensor, target_f: torch.Tensor) -> torch.Tensor:
        """feature_loss_weight · SmoothL1(f̂, f) (mean over every counted position) + token_loss_weight · token
        loss."""
        smooth_l1 = F.smooth_l1_loss(rows.float(), target_f.float(), reduction="none").mean(-1)
        return self.config.feature_loss_weight * smooth_l1.mean() + self.config.token_loss_weight * token_loss

    def _bound_lm_head(self) -> nn.Module:
        if self._lm_head is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        return self._lm_head

    # ---- training (core/drafter.py: TrainableDrafter) -------------------------------------------

    training_loss = draft_layer.training_loss  # the training-time test and its loss
    set_objective = draft_layer.set_objective  # train.loss / train.depth_weights (heads/parts/objective.py)
    param_groups = one_param_group

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first)."""
        self.vocab.choose(token_counts)

    # ---- drafting (core/drafter.py: Drafter), a generation's state in heads/parts/draft_layer.py --------

    reset, observe, propose = drafting_methods(LayerDrafting)
