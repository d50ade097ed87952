"""Medusa-2 — Cai et al. 2024, §2.3.2: train LoRA on the target jointly with the Medusa heads.

input_ids -> LoRA-adapted target decoder -> h_t [b, s, H] (with gradients through the adapter)
  loss = target loss (next-token CE, or KL to the adapter-disabled target) + w * sum_k decay^(k-1) CE_k

`Medusa2Config` (`type: medusa2`) holds the heads' settings and the adapter's. `Medusa2Drafter` holds both
parts: `medusa`, plain Medusa heads (heads/medusa.py), and `target`,
the target wrapped with its LoRA adapter. The adapter is injected into the target *in place*
(peft), so the caller's target object becomes the adapted model; `adapted_target()` returns the
peft wrapper, whose `disable_adapter()` context gives the original target back. The heads were
trained on the adapted target's features: evaluate with the adapted target. Saved as the heads'
weights file plus the adapter in PEFT format (`adapter/`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.heads.medusa import MedusaConfig, MedusaDrafter, check_heads
from draftheads.heads.parts.common import masked_ce, mean_loss, shift_mask
from draftheads.heads.parts.draft_vocab import check_draft_vocab
from draftheads.heads.parts.protocol import new_for_target, trainable

ADAPTER = "adapter"
HEAD_FIELDS = ("num_heads", "num_layers", "lm_head", "loss_decay", "soft_labels", "draft_vocab_size", "head_lr")


@dataclass
class Medusa2Config:
    """Medusa-2: Medusa heads trained jointly with a LoRA adapter on the target."""

    type: Literal["medusa2"] = doc("medusa2", "head type")
    num_heads: int = doc(4, "K: head k predicts token t+k+1")
    num_layers: int = doc(1, "residual blocks per head (each with its own weights)")
    lm_head: Literal["shared", "own"] = doc("shared", "'shared': the target's frozen lm_head; 'own': a trainable "
                                                      "copy per head")
    loss_decay: float = doc(0.8, "lambda: head k's loss is weighted lambda^(k-1)")
    soft_labels: bool = doc(False, "train the heads against the target's whole distribution of each token")
    draft_vocab_size: int | None = doc(None, "draft only among this many most frequent target-generated tokens")
    head_lr: float | None = doc(None, "learning rate of the heads (default: 4x train.lr)")
    target_loss: Literal["lm", "kl"] = doc("lm", "the adapted target's loss: next-token CE, or KL to the "
                                                 "adapter-disabled target")
    heads_weight: float = doc(0.2, "weight of the heads' loss next to the target loss")
    lora_r: int = doc(16, "LoRA rank")
    lora_alpha: int = doc(32, "LoRA alpha")
    lora_dropout: float = doc(0.05, "LoRA dropout")
    lora_target_modules: list[str] = doc(["q_proj", "k_proj", "v_proj", "o_proj"], "LoRA target module names")
    init_from: str | None = doc(None, "start from an existing drafter (native or an engine/public layout)")

    def __post_init__(self):
        check_heads(self)
        check(self.heads_weight > 0, "head.heads_weight must be positive")
        check(self.lora_r > 0, f"head.lora_r must be positive, got {self.lora_r}")
        check(0 <= self.lora_dropout < 1, f"head.lora_dropout must be in [0, 1), got {self.lora_dropout}")

    def resolve(self, num_layers: int, vocab_size: int) -> None:
        check_draft_vocab(self.draft_vocab_size, vocab_size)

    @property
    def depth(self) -> int:
        return self.num_heads

    def heads(self) -> MedusaConfig:
        """The heads' own config."""
        return MedusaConfig(**{name: getattr(self, name) for name in HEAD_FIELDS})


class AdapterFiles:
    """Medusa-2's folder: the heads' weights file, and the LoRA adapter in PEFT format beside it (adapter/)."""

    def __init__(self, drafter: "Medusa2Drafter"):
        self.drafter = drafter

    @property
    def module(self) -> nn.Module:
        return self.drafter.medusa

    def save_extras(self, folder) -> None:
        """adapter/adapter_config.json + adapter_model.safetensors."""
        self.drafter.adapted_target().save_pretrained(str(Path(folder) / ADAPTER), safe_serialization=True)

    def load_extras(self, folder) -> None:
        """Load the adapter save_extras wrote into the bound, adapted target."""
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        folder = Path(folder) / ADAPTER
        if not (folder / "adapter_model.safetensors").is_file():
            raise DraftheadsError(f"'{folder.parent}' has no {ADAPTER}/adapter_model.safetensors; a Medusa-2 drafter "
                                  "needs its LoRA adapter")
        model = self.drafter.adapted_target()
        device = next(model.parameters()).device
        weights = load_peft_weights(str(folder), device=str(device))
        result = set_peft_model_state_dict(model, weights)
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            bad = (list(result.unexpected_keys) + missing)[:3]
            raise DraftheadsError(f"the adapter in '{folder}' does not match the drafter's LoRA config (e.g. {bad}); "
                                  "re-export it")


class Medusa2Drafter(nn.Module):
    """Medusa heads and the target's LoRA adapter, trained together (composition: it owns both)."""

    feature_layers = (-1,)
    trains_target = True  # the loss runs the adapted target: online training only, no cached features

    def __init__(self, config: Medusa2Config, target_config):
        super().__init__()
        self.config = config
        self.medusa = MedusaDrafter(config.heads(), target_config)
        self.target = None  # the adapted target, registered at bind so its adapter trains and syncs with the heads
        self.files = AdapterFiles(self)

    def __copy__(self) -> "Medusa2Drafter":
        """Another row's drafter (decoding/decoder.py): the heads' drafting state is in `medusa`, so it is copied
        too (sharing the weights); the adapted target is shared."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._modules = {**self._modules, "medusa": copy.copy(self.medusa)}
        return twin

    from_target = classmethod(new_for_target)  # the protocol's one-liners: heads/parts/protocol.py

    @property
    def vocab(self):
        return self.medusa.vocab

    @property
    def hidden_size(self) -> int:
        return self.medusa.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.medusa.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        return self.medusa.dtype

    @property
    def default_tree(self):
        return self.medusa.default_tree

    def bind(self, target) -> "Medusa2Drafter":
        """Wrap the target with a fresh LoRA adapter and give the heads its (frozen) lm_head."""
        self.target = attach_lora(target, self.config)
        self.medusa.bind(self.target.get_base_model())
        return self

    def adapted_target(self):
        """The LoRA-adapted target (a peft model); `with m.disable_adapter():` gives the original."""
        if self.target is None:
            raise DraftheadsError("the Medusa-2 drafter is not bound to a target; call drafter.bind(target) first")
        return self.target

    # ---- training (core/drafter.py: TrainableDrafter) -------------------------------------------

    def training_loss(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """Target loss + heads_weight * heads' loss, all on the adapted target's features.

        metrics add "target_loss_sum" [1] and "target_total" [1] for the target's own loss.
        """
        config = self.config
        hidden = self._adapted_hidden(batch)
        heads_loss, metrics = self.medusa.heads_loss(hidden.to(self.dtype), batch)
        if config.target_loss == "lm":
            target_sum, _, total = masked_ce(hidden, batch, 1, self.medusa._lm_head)
        else:
            target_sum, total = self._kl_to_original(hidden, batch)
        loss = mean_loss(target_sum, total) + config.heads_weight * heads_loss
        metrics["target_loss_sum"] = target_sum.detach().float().reshape(1)
        metrics["target_total"] = torch.tensor([total], device=hidden.device)
        return loss, metrics

    def set_objective(self, objective) -> None:
        """train.loss and train.depth_weights apply to the heads (the target's own loss is head.target_loss)."""
        self.medusa.set_objective(objective)
        self.objective = objective

    def _adapted_hidden(self, batch: dict) -> torch.Tensor:
        """[b, s, H] last hidden state (after the final norm) of the adapted target."""
        decoder = self.adapted_target().get_base_model().get_decoder()
        positions = batch.get("position_ids")
        # packed rows: no mask and no cache, so that transformers builds a mask from the restarting positions
        out = decoder(input_ids=batch["input_ids"], attention_mask=None if positions is not None else
                      batch["attention_mask"], position_ids=positions, use_cache=False)
        return out.last_hidden_state

    def _kl_to_original(self, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, int]:
        """Sum over counted positions of KL(p_original || p_adapted) for the next token."""
        mask = shift_mask(batch, 1)
        with torch.no_grad(), self.adapted_target().disable_adapter():
            original = self._adapted_hidden(batch)
        log_p = F.log_softmax(self.medusa._lm_head(original[:, :-1][mask]).float(), dim=-1)
        log_q = F.log_softmax(self.medusa._lm_head(hidden[:, :-1][mask]).float(), dim=-1)
        return F.kl_div(log_q, log_p, log_target=True, reduction="sum"), int(mask.sum())

    def param_groups(self, lr: float) -> list[dict]:
        """The heads at head_lr (default 4x lr), the LoRA adapter at lr."""
        return [{"params": trainable(self.medusa), "lr": self.config.head_lr or 4 * lr},
                {"params": trainable(self.adapted_target()), "lr": lr}]

    def set_draft_vocab(self, token_counts: torch.Tensor) -> None:
        self.medusa.set_draft_vocab(token_counts)

    # ---- drafting: the heads', on the adapted target's features ---------------------------------

    def reset(self) -> None:
        self.medusa.reset()

    def observe(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        self.medusa.observe(features, next_tokens)

    def propose(self, tree, *, temperature=0.0, top_k=0, top_p=1.0, generator=None):
        return self.medusa.propose(tree, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)


def attach_lora(target, config: Medusa2Config):
    """Wrap `target` with a fresh LoRA adapter (r, alpha, dropout, modules from `config`)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if isinstance(target, PeftModel):
        return target
    if hasattr(target, "peft_config"):
        raise DraftheadsError("the target already carries a peft adapter; load a fresh target for a Medusa-2 drafter")
    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(target, lora)
    except ValueError as e:
        first = str(e).strip().splitlines()[0][:200]
        raise DraftheadsError(f"head.lora_target_modules does not fit this target: {first}") from None
