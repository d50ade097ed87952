"""EAGLE-3 — Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test".

[h_low; h_mid; h_high] [b, s, 3H] -> fc -> decoder layer over [norm(emb); norm(h)] (2H) -> norm -> draft lm_head

The fused features are the outputs of three target layers (config `feature_layers`, default
{1, N//2-1, N-4}: the hidden states entering layers {2, N//2, N-3}, the engines' default). The layer is the target's
own class with q/k/v widened to 2H inputs; its residual stream stays the H-wide hidden state. The
output head is the drafter's own, over a draft vocabulary (d2t/t2d, heads/parts/draft_vocab.py), started
as the target's rows for it. Loss per unroll step j (heads/parts/draft_layer.py): soft CE against the
target's distribution restricted to the draft vocabulary (renormalised), weighted ttt_decay^j, so
positions whose target argmax lies outside it still count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.core.target_family import layer_rotary, norm_eps
from draftheads.core.tree import parse_tree
from draftheads.heads.parts import draft_layer
from draftheads.heads.parts.common import bind_frozen
from draftheads.heads.parts.draft_layer import MAX_TTT_STEPS, LayerDrafting, TttMode, check_unroll, ttt_mode_setting
from draftheads.heads.parts.draft_vocab import DraftVocabulary, check_draft_vocab
from draftheads.heads.parts.files import WeightsOnly
from draftheads.heads.parts.layers import bind_parts, build_decoder_layer, make_norm, run_layer, widen_attention_inputs
from draftheads.heads.parts.target_init import Init, init_setting
from draftheads.heads.parts.protocol import drafting_methods, new_for_target, one_param_group


@dataclass
class Eagle3Config:
    """EAGLE-3 hyper-parameters (hidden size, vocabulary and layer count come from the target)."""

    type: Literal["eagle3"] = doc("eagle3", "head type")
    feature_layers: list[int] | None = doc(None, "the target layers whose OUTPUTS are fused, in increasing order "
                                                 "(default {1, N//2-1, N-4}: the inputs of layers {2, N//2, N-3}, the "
                                                 "engines' default eagle_aux_hidden_state_layer_ids)")
    draft_vocab_size: int | None = doc(None, "its own lm_head drafts among this many most frequent target-generated "
                                             "tokens (default min(32000, target vocab))")
    ttt_steps: int = doc(1, "training-time test: unroll this many steps on the drafter's own outputs")
    ttt_decay: float = doc(0.8, "training-time test: step j's loss is weighted decay^j")
    ttt_mode: TttMode = ttt_mode_setting()
    input_noise: float = doc(0.2, "width of the uniform noise added to input features during training (0 = off)")
    token_loss_fraction: float = doc(1.0, "share of positions, drawn anew each training step, that get the "
                                          "vocabulary-sized token loss; < 1 trades a noisier loss for speed")
    default_tree: str = doc("dynamic:8,6,48",
                            "tree used when the caller gives none (chain:K, dynamic:TOPK,DEPTH,TOTAL)")
    init: Init = init_setting()
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")
    draft_layer: Literal["llama", "target"] | None = doc(None, "the draft layer's class: 'llama' (the default: what "
                                                               "SGLang, vLLM, llama.cpp and speculators load for any "
                                                               "target) or 'target' (the target's own decoder-layer "
                                                               "class, e.g. Qwen3's with q/k norms)")

    def __post_init__(self):
        check_unroll(self)
        check_feature_layers(self.feature_layers)

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        """Fill the values derived from the target and check those that depend on it."""
        resolve_eagle3(self, num_layers, vocab_size)

    @property
    def depth(self) -> int:
        return MAX_TTT_STEPS  # autoregressive: any draft depth


def check_feature_layers(layers: list[int] | None) -> None:
    """head.feature_layers, when given: 3 different layers in increasing order (EAGLE-3 and P-EAGLE)."""
    if layers is None:
        return
    check(len(layers) == 3, f"head.feature_layers must list 3 target layers, got {len(layers)}")
    # engines capture the layers in layer order: an unsorted list would silently permute fc's input columns
    check(list(layers) == sorted(set(layers)),
          f"head.feature_layers must be 3 different layers in increasing order, got {list(layers)}")


def resolve_eagle3(config, num_layers: int, vocab_size: int) -> None:
    """Fill and check what an EAGLE-3-style config (Eagle3Config, PEagleConfig) derives from the target: the draft
    layer's class, the fused layers and the draft vocabulary's size."""
    if config.draft_layer is None:
        config.draft_layer = "llama"
    if config.feature_layers is None:
        config.feature_layers = default_feature_layers(num_layers)
    for layer in config.feature_layers:
        check(0 <= layer < num_layers,
              f"head.feature_layers: layer {layer} does not exist (the target has {num_layers} layers)")
    if config.draft_vocab_size is None:
        config.draft_vocab_size = min(32000, vocab_size)
    check_draft_vocab(config.draft_vocab_size, vocab_size)


def default_feature_layers(num_layers: int) -> list[int]:
    """The layers whose outputs EAGLE-3 fuses by default: the inputs of layers (2, N//2, N-3), which vLLM, SGLang,
    SpecForge and llama.cpp capture when a drafter names none; on targets too shallow for three different ones of
    those, three spread over the layers below the last."""
    engines = [2 - 1, num_layers // 2 - 1, num_layers - 3 - 1]
    if len(set(engines)) == 3 and engines[0] < engines[1] < engines[2]:
        return engines
    check(num_layers >= 3, f"EAGLE-3 fuses three different target layers; this target has only {num_layers}")
    return [0, (num_layers - 1) // 2, num_layers - 2] if num_layers >= 4 else [0, 1, 2]


class Eagle3Drafter(nn.Module):
    """EAGLE-3: fc over three fused target layers into one decoder layer that attends over
    [norm(emb); norm(h)], with its own final norm and lm head over the draft vocabulary.

    The carry at position t is the hidden state: fc(fused features) at first, then the layer's own
    previous output.
    """

    trains_target = False

    def __init__(self, config: Eagle3Config, target_config):
        super().__init__()
        dims = target_dims(target_config)
        hidden = dims.hidden_size
        self.config = config
        self.hidden_size, self.vocab_size = hidden, dims.vocab_size
        self.layer = build_decoder_layer(target_config, config.draft_layer or "llama")
        if not hasattr(self.layer, "input_layernorm"):   # it normalises h, the attention's second input
            raise DraftheadsError(f"head.draft_layer: target needs a pre-norm layer, and {type(self.layer).__name__} "
                                  "normalises after attention; use head.draft_layer: llama (the default)")
        eps = norm_eps(target_config)
        # the target's hidden_states[l + 1] is the output of layer l, the input of layer l + 1
        self.feature_layers = tuple(layer + 1 for layer in config.feature_layers) + (-1,)
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        widen_attention_inputs(self.layer, 2 * hidden)
        self.layer.self_attn.register_forward_pre_hook(_prepend_embeddings, with_kwargs=True)
        self.embed_norm = make_norm(self.layer, hidden, eps)  # the layer's input_layernorm normalises h
        self.norm = make_norm(self.layer, hidden, eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.vocab = DraftVocabulary(self, config.draft_vocab_size, dims.vocab_size)
        self.default_tree = parse_tree(config.default_tree)
        self.files = WeightsOnly(self)
        bind_frozen(self, _lm_head=None)
        self.reset()

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    def bind(self, target) -> "Eagle3Drafter":
        """Share the target's frozen embedding, lm_head (for the soft labels) and rotary embedding."""
        bind_parts(self, target, "EAGLE-3", ("embed", "lm_head"), rotary=layer_rotary(self.layer))
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def draft_layers(self) -> list[nn.Module]:
        """The decoder layer head.init: target_layer copies the target's last layer into."""
        return [self.layer]

    def fusion_inputs(self) -> list[tuple[nn.Linear, int]]:
        """fc and where the highest fused layer's columns start (head.init: target_layer passes them through)."""
        return [(self.fc, 2 * self.hidden_size)]

    # ---- the two ends of the layer (heads/parts/draft_layer.py) ------------------------------

    def initial_carry(self, features: torch.Tensor) -> torch.Tensor:
        """features [b, n, 4H] (three fused layers, then the last hidden state) -> fc(fused) [b, n, H]."""
        return self.fc(features[..., : 3 * self.hidden_size])

    def forward_layer(self, carry, tokens, position_ids, visible, cache=None) -> torch.Tensor:
        """carry [b, n, H], tokens [b, n] (x_{t+1} at position t) -> layer output [b, n, H].

        The layer runs its own class's forward (with draft_layer: target, Gemma's extra norms or Granite's
        multipliers too): its attention reads [norm(emb); norm(h)], which `_prepend_embeddings`, a forward pre-hook
        on the attention, makes from the `draft_embeds` given here and the layer's own input_layernorm(h). Writing
        that forward out here would fix one class's (Llama's) for all."""
        emb = self._embed(tokens).to(carry.dtype)
        return run_layer(self.layer, self._rotary, carry, position_ids, visible, cache,
                         draft_embeds=self.embed_norm(emb))

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> [..., Vd] fp32 logits of the own lm head over the draft vocabulary."""
        return self.lm_head(self.norm(out)).float()

    def target_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's logits from its final features [..., H], over the draft vocabulary's columns
        (softmax over them is the target's distribution restricted to it)."""
        if self._lm_head is None:
            raise DraftheadsError("the drafter is not bound to a target; call drafter.bind(target) first")
        return self.vocab.project(self._lm_head, features)

    def vocab_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Layer output [..., H] -> [..., V] over the target vocabulary (-inf outside the draft vocabulary)."""
        return self.vocab.widen(self.draft_logits(out))

    def position_loss(self, token_loss: torch.Tensor, rows: torch.Tensor, target_f: torch.Tensor) -> torch.Tensor:
        """The token loss alone: EAGLE-3 does not regress the target's features."""
        return token_loss

    # ---- training (core/drafter.py: TrainableDrafter) -------------------------------------------

    training_loss = draft_layer.training_loss  # the training-time test and its loss
    set_objective = draft_layer.set_objective  # train.loss / train.depth_weights (heads/parts/objective.py)
    param_groups = one_param_group

    @torch.no_grad()
    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        """Draft among the draft_vocab_size tokens most frequent in token_counts [V] (ties: lower id first);
        once bound, the own lm head restarts as the target's rows for them."""
        chosen = self.vocab.choose(token_counts)
        if self._lm_head is not None:
            self.lm_head.weight.copy_(self._lm_head.weight[chosen])

    # ---- drafting (core/drafter.py: Drafter), a generation's state in heads/parts/draft_layer.py --------

    reset, observe, propose = drafting_methods(LayerDrafting)


def _prepend_embeddings(attention: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook on the attention: its input becomes [norm(emb); norm(h)] (2H).

    The decoder layer passes unknown keyword arguments down to its attention; the embeddings
    ride along as `draft_embeds`, while the residual stream stays the H-wide hidden state.
    """
    embeds = kwargs.pop("draft_embeds", None)
    if embeds is None:
        return args, kwargs
    if "hidden_states" in kwargs:
        kwargs["hidden_states"] = torch.cat([embeds, kwargs["hidden_states"]], dim=-1)
    else:
        args = (torch.cat([embeds, args[0]], dim=-1), *args[1:])
    return args, kwargs
