"""vLLM's DeepSeek MTP layout (`DeepseekV3ForCausalLM` with num_nextn_predict_layers): written down
so that an MTP export is refused with the reason, since its block is a DeepSeek-V2 layer.
"""

from __future__ import annotations

from draftheads.interop.layout import VLLM, Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

LAYOUTS = (
    Layout(
        format="deepseek-mtp", kind="mtp", engine="vLLM (DeepSeekMTPModel)", weights_file="model.safetensors",
        architectures=("DeepseekV3ForCausalLM",),
        config={"num_nextn_predict_layers": "D",
                "(rest)": "the target's DeepSeek-V3 config (the target loads the same folder)"},
        tensors=(
            Tensor("model.layers.{k}.enorm.weight", ("H",)),
            Tensor("model.layers.{k}.hnorm.weight", ("H",)),
            Tensor("model.layers.{k}.eh_proj.weight", ("H", "2H")),  # input [enorm(emb); hnorm(h)]: embedding FIRST
            Tensor("model.layers.{k}.shared_head.norm.weight", ("H",)),
            Tensor("model.layers.{k}.shared_head.head.weight", ("V", "H")),
            Tensor("model.layers.{k}.embed_tokens.weight", ("V", "H")),
        ),
        families=("deepseek_v3",),
        read_from=(LoaderFile(VLLM, "vllm/model_executor/models/deepseek_mtp.py",
                              "4f7c14402630b97c8c078523fca8edef287ed2cf"),),
        traps=(
            "the MTP block is a DeepseekV2DecoderLayer (MLA + MoE): a Llama-family block has no engine that loads it",
            "modules live at layer index num_hidden_layers + k; block weights sit beside enorm/hnorm/eh_proj",
            "module k is built as layer N+k, so with first_k_dense_replace <= N+k it is a MoE layer (per-expert "
            "weights mlp.experts.{e}.*); a copy of layer 0 is dense when first_k_dense_replace > 0",
            "embeddings at position 0 are zeroed; "
            "the MTP input is [enorm(emb); hnorm(h)] (ours is [hnorm(h); enorm(emb)])",
        ),
    ),
)


def refusal(saved: SavedDrafter) -> str | None:
    """Why our MTP modules cannot go to this layout (always: no writer exists)."""
    dense = not any(".mlp.experts." in k for k in saved.state)
    block = "a dense-MLP layer like the target's layer 0" if dense else "the target's layer 0"
    return (f"our MTP block is {block}, while vLLM builds module k as layer N+k (a DeepSeek-V2 MoE layer with "
            "per-expert weights); writing it is not implemented")


WRITERS: dict = {}
