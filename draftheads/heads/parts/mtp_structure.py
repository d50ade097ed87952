"""How a drafter's MTP modules are laid out: ours (heads/mtp.py, trained from scratch) and the ones checkpoints ship
(heads/native_mtp.py: DeepSeek-V3 / GLM-4.5 NextN layers, Qwen3-Next / Qwen3.5 `mtp.*`).

Every layout is DeepSeek-V3's module (§2.2): h^k = Layer(W [norm(emb(x_{t+k})); norm(h^{k-1})]) and logits from a
final norm and the target's lm_head. They differ in the details below, each read from the engines' loaders
(vLLM deepseek_mtp.py, qwen3_next_mtp.py; transformers 5.24 modeling_layers.MtpLayer).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MTPStructure:
    modules: int                          # distinct modules; draft step k runs module (k - 1) % modules, vLLM's rule
    embedding_first: bool = False         # the projection reads [enorm(emb); hnorm(h)] (every shipped layout)
    own_norm: bool = False                # a final norm of the module's own (shared_head.norm, mtp.norm), else the
    #                                       target's final norm
    carry_normed: bool = False            # the next step reads the normed output (Qwen's mtp.norm), else the raw one
    zero_first_embedding: bool = False    # the embedding at position 0 is zeroed (vLLM's DeepSeek MTP does)
    layer_overrides: tuple[tuple[str, object], ...] = ()   # config fields of the module's decoder layer
    frozen_layer: bool = False            # only the fusion (norms, projection) trains; the decoder layer stays
    lora: tuple[int, float, tuple[str, ...]] | None = None   # (rank, alpha, module names): LoRA on the decoder layer's
    #                                       linear modules (peft), the layer's own weights frozen
    window: int | None = None             # a sliding-window layer (MiMo-V2's): a key at position k is seen by a query
    #                                       at q only while q - k < window, as transformers' sliding masks

    def module_of(self, step: int) -> int:
        """The module (0-based) draft step `step` (1-based) runs."""
        return (step - 1) % self.modules
