"""The MTP layers a checkpoint ships, as a drafter to evaluate and fine-tune: `head.type: native`.

DeepSeek-V3 §2.2's modules as 2026's checkpoints carry them (read from vLLM's loaders, commits in
interop/shipped_mtp.py):
  NextN (deepseek_v3, glm4_moe): model.layers.{N+i}: enorm, hnorm, eh_proj over [enorm(emb); hnorm(h)], a MoE decoder
      layer, shared_head.norm; the next step reads the layer's output before that norm.
  Qwen MTP (qwen3_next, qwen3_5, qwen3_5_moe): mtp.pre_fc_norm_embedding / pre_fc_norm_hidden, mtp.fc, mtp.layers.0
      (a full-attention layer), mtp.norm; the next step reads the normed output.
  MiMo-V2 (mimo_v2_flash): model.mtp.layers.{i}: enorm, hnorm, eh_proj, a sliding-window layer with attention sinks
      and a dense MLP (pre_mlp_layernorm), final_layernorm; the next step reads the normed output; vLLM runs layer 0.
Draft step k runs module (k-1) mod count, vLLM's rule: a one-module checkpoint drafting 3 tokens runs its module 3
times (FastMTP's recursion), and fine-tuning unrolls it the same way, step k's loss weighted step_decay^(k-1)
(FastMTP: 0.51 / 0.31 / 0.18 for 3 steps at 0.6). The embedding and lm_head stay the target's, frozen; the drafter is
heads/mtp.py's MTPDrafter built with the shipped structure. Its weights come from the checkpoint
(interop/shipped_mtp.py: read, and written back into a copy of the checkpoint by export --format checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import text_config
from draftheads.core.tree import parse_tree
from draftheads.heads.parts.common import check_step_weights, step_loss_weights
from draftheads.heads.parts.draft_vocab import check_draft_vocab
from draftheads.heads.parts.mtp_structure import MTPStructure

MAX_DEPTH = 8
NEXTN = ("deepseek_v3", "glm4_moe")
QWEN = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MIMO = ("mimo_v2_flash",)
FAMILIES = "DeepSeek-V3 and GLM-4.5 (NextN layers), Qwen3-Next and Qwen3.5 (mtp.*), MiMo-V2 (model.mtp.layers)"


@dataclass
class NativeConfig:
    """Settings of a shipped MTP drafter (its structure and weights come from the target's checkpoint)."""

    type: Literal["native"] = doc("native", "head type")
    depth: int = doc(3, "draft steps; beyond the shipped modules, step k reruns module (k-1) mod their count")
    step_decay: float = doc(0.6, "step k's loss weight is step_decay^(k-1), normalised (FastMTP's schedule)")
    step_weights: list[float] | None = doc(None, "per-step loss weights, instead of step_decay's")
    train_only: Literal["all", "fusion", "lora"] = doc("all", "what fine-tunes: everything; only the fusion (the two "
                                                              "input norms, the projection, the output norm); or the "
                                                              "fusion and LoRA adapters on the decoder layer's linear "
                                                              "modules, where the layer is large (a MoE layer)")
    lora_r: int = doc(16, "LoRA rank (train_only: lora)")
    lora_alpha: float = doc(32.0, "LoRA alpha: the adapters' update is scaled by lora_alpha / lora_r")
    lora_targets: list[str] = doc(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                   "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"],
                                  "the decoder layer's linear modules that get adapters (those the layer has; fused "
                                  "MoE experts are parameters, not modules, and stay as shipped)")
    normed_carry: bool | None = doc(None, "the next step reads the module's normed output (default: as vLLM runs "
                                          "this layout: normed for Qwen MTP, raw for NextN)")
    checkpoint: str | None = doc(None, "the checkpoint folder or hub id whose MTP layers are read (default: the "
                                       "target's own)")
    soft_labels: bool = doc(False, "train against the target's whole distribution of each token")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens")
    default_tree: str | None = doc(None, "tree used when the caller gives none (default chain:depth)")
    init_from: str | None = doc(None, "start from a drafter saved by an earlier fine-tune instead of the shipped one")

    def __post_init__(self):
        check_step_weights(self, MAX_DEPTH)
        check(self.draft_vocab_size is None or self.draft_vocab_size > 0, "head.draft_vocab_size must be positive")
        check(self.lora_r >= 1 and self.lora_alpha > 0, f"head.lora_r must be >= 1 and head.lora_alpha > 0, got "
                                                        f"{self.lora_r} and {self.lora_alpha}")
        parse_tree(self.default_tree, "head.default_tree")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        check_draft_vocab(self.draft_vocab_size, vocab_size)

    step_loss_weights = step_loss_weights   # heads/parts/common.py, shared with the Gemma 4 assistant

    def structure(self, target_config) -> MTPStructure:
        """The shipped layout of this target's family and its module count (refused in one line where it ships
        none we read)."""
        layout = shipped_layout(target_config)
        count = shipped_count(target_config, layout)
        frozen = self.train_only == "fusion"
        lora = (self.lora_r, self.lora_alpha, tuple(self.lora_targets)) if self.train_only == "lora" else None
        if layout == "nextn":
            carry = bool(self.normed_carry)
            dense = (("first_k_dense_replace", 0),)   # the module is a MoE layer, built at an index past the dense
            return MTPStructure(count, embedding_first=True, own_norm=True, carry_normed=carry,
                                zero_first_embedding=text_config(target_config).model_type == "deepseek_v3",
                                layer_overrides=dense, frozen_layer=frozen, lora=lora)
        carry = True if self.normed_carry is None else self.normed_carry
        if layout == "mimo":   # a sliding-window layer with a dense MLP: the first of the shipped ones (vLLM's)
            shape = (("layer_types", ["sliding_attention"]), ("mlp_layer_types", ["dense"]))
            return MTPStructure(1, embedding_first=True, own_norm=True, carry_normed=carry, layer_overrides=shape,
                                frozen_layer=frozen, lora=lora, window=text_config(target_config).sliding_window)
        return MTPStructure(count, embedding_first=True, own_norm=True, carry_normed=carry, frozen_layer=frozen,
                            lora=lora)


def shipped_layout(target_config) -> str:
    """'nextn', 'qwen' or 'mimo': how this target family's checkpoints ship MTP layers."""
    family = text_config(target_config).model_type
    if family in NEXTN:
        return "nextn"
    if family in QWEN:
        return "qwen"
    if family in MIMO:
        return "mimo"
    raise DraftheadsError(f"head.type native reads the MTP layers that {FAMILIES} checkpoints ship; a {family} target "
                          "ships none of those; use head.type mtp to train MTP modules from scratch")


def shipped_count(target_config, layout: str) -> int:
    """How many MTP modules the config says the checkpoint holds."""
    t = text_config(target_config)
    if layout == "mimo":   # MiMo-V2 ships 3 and its config names none; vLLM runs the first (mimo_v2_mtp.py)
        return 1
    if layout == "nextn":
        count = getattr(t, "num_nextn_predict_layers", None)
        field = "num_nextn_predict_layers"
    else:
        count = getattr(t, "mtp_num_hidden_layers", None) or getattr(t, "num_nextn_predict_layers", None) or 1
        field = "mtp_num_hidden_layers"
    if not count:
        raise DraftheadsError(f"this {t.model_type} target's config says it ships no MTP layers ({field}: {count}); "
                              "use the checkpoint that has them, or head.type mtp to train MTP modules from scratch")
    if layout == "qwen" and count != 1:
        raise DraftheadsError(f"this {t.model_type} checkpoint ships {count} MTP layers behind one mtp.fc; draftheads "
                              "reads Qwen MTP checkpoints with one (every Qwen3-Next and Qwen3.5 release)")
    return int(count)


def merged_state(state: dict, config: NativeConfig) -> dict:
    """A native drafter's tensors with its LoRA adapters merged into the weights they adapt (W + alpha/r · B A) and
    peft's names undone: the layer as the checkpoint holds it. Without adapters, the tensors as they are."""
    if not any(".lora_A." in key for key in state):
        return dict(state)
    scale = config.lora_alpha / config.lora_r
    out = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if ".base_layer." in key:
            module = key.split(".base_layer.")[0]
            if key.endswith(".weight"):
                a, b = state[f"{module}.lora_A.default.weight"], state[f"{module}.lora_B.default.weight"]
                value = (value.float() + scale * (b.float() @ a.float())).to(value.dtype)
            key = key.replace(".base_layer.", ".")
        out[key] = value
    return out
