"""Medusa-2 — Cai et al. 2024, §2.3.2: train LoRA on the target jointly with the Medusa heads.

input_ids -> LoRA-adapted target decoder -> h_t [b, s, H] (with gradients through the adapter)
  loss = target loss (next-token CE, or KL to the adapter-disabled target) + w * sum_k decay^(k-1) CE_k

The adapter is injected into the target *in place* (peft), so the caller's target object becomes
the adapted model; `MedusaDrafter.adapted_target()` returns the peft wrapper, whose
`disable_adapter()` context gives the original target back. The heads were trained on the adapted
target's features: evaluate with the adapted target.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from draftheads.errors import DraftheadsError
from draftheads.heads.common import masked_ce, mean_loss, shift_mask


def attach_lora(target, config):
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


def adapted_target(drafter):
    if not drafter.config.medusa2:
        raise DraftheadsError("adapted_target() only applies to Medusa-2 drafters (head.medusa2: true)")
    if "target" not in drafter._modules:
        raise DraftheadsError("the Medusa-2 drafter is not bound to a target; call drafter.bind(target) first")
    return drafter.target


def adapted_hidden(drafter, batch: dict) -> torch.Tensor:
    """[b, s, H] last hidden state (after the final norm) of the adapted target."""
    decoder = adapted_target(drafter).get_base_model().get_decoder()
    out = decoder(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch.get("position_ids")
    )
    return out.last_hidden_state


def training_loss(drafter, batch: dict) -> tuple[torch.Tensor, dict]:
    """Target loss + medusa2_head_weight * heads' loss, all on the adapted target's features.

    metrics add "target_loss_sum" [1] and "target_total" [1] for the target's own loss.
    """
    config = drafter.config
    hidden = adapted_hidden(drafter, batch)
    heads_loss, metrics = drafter.heads_loss(hidden.to(drafter.dtype), batch)
    if config.medusa2_loss == "lm":
        target_sum, _, total = masked_ce(hidden, batch, 1, drafter._lm_head)
    else:
        target_sum, total = _kl_to_original(drafter, hidden, batch)
    loss = mean_loss(target_sum, total) + config.medusa2_head_weight * heads_loss
    metrics["target_loss_sum"] = target_sum.detach().float().reshape(1)
    metrics["target_total"] = torch.tensor([total], device=hidden.device)
    return loss, metrics


def _kl_to_original(drafter, hidden: torch.Tensor, batch: dict) -> tuple[torch.Tensor, int]:
    """Sum over counted positions of KL(p_original || p_adapted) for the next token."""
    mask = shift_mask(batch, 1)
    with torch.no_grad(), adapted_target(drafter).disable_adapter():
        original = adapted_hidden(drafter, batch)
    log_p = F.log_softmax(drafter._lm_head(original[:, :-1][mask]).float(), dim=-1)
    log_q = F.log_softmax(drafter._lm_head(hidden[:, :-1][mask]).float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="sum"), int(mask.sum())


def lora_parameters(drafter) -> list[torch.nn.Parameter]:
    return [p for p in adapted_target(drafter).parameters() if p.requires_grad]


def save_adapter(drafter, folder) -> None:
    """PEFT format: adapter_config.json + adapter_model.safetensors in `folder`."""
    adapted_target(drafter).save_pretrained(str(folder), safe_serialization=True)


def load_adapter(drafter, folder) -> None:
    """Load a PEFT adapter folder written by save_adapter into the bound, adapted target."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    folder = Path(folder)
    if not (folder / "adapter_model.safetensors").is_file():
        raise DraftheadsError(f"'{folder}' has no adapter_model.safetensors; a Medusa-2 drafter needs its LoRA adapter")
    model = adapted_target(drafter)
    device = next(model.parameters()).device
    weights = load_peft_weights(str(folder), device=str(device))
    result = set_peft_model_state_dict(model, weights)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        bad = (list(result.unexpected_keys) + missing)[:3]
        raise DraftheadsError(f"the adapter in '{folder}' does not match the drafter's LoRA config (e.g. {bad}); re-export it")
