"""What each serving engine's loader expects from a draft-head folder, written down as data.

Read from the loaders' source (not copied), late 2026. Every layout names the file and the commit
we read; `traps` lists the ways that loader fails *silently*, which export.py must avoid.
Shapes use symbols: H hidden size, V target vocabulary, Vd draft vocabulary, I MLP width,
Q = heads * head_dim, KV = kv_heads * head_dim, D = head_dim; "2H" = 2 * H. Key patterns use {h}
(Medusa head), {l} (layer inside a head), {k} (MTP module, counted from the target's last layer).
A tensor with `when` is present only if that feature is on (see `FEATURES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FEATURES = {
    "qkv_bias": "the draft layer's q/k/v projections carry biases (Qwen2 family)",
    "o_bias": "the draft layer's o_proj carries a bias",
    "qk_norm": "per-head RMSNorm on q and k (Qwen3 family)",
    "own_lm_head": "each Medusa head has its own lm head (else the target's is shared)",
}


@dataclass(frozen=True)
class Tensor:
    key: str
    shape: tuple[str, ...]
    dtype: str = "float"  # "float" (the export dtype), "int64" or "bool"
    when: str | None = None


@dataclass(frozen=True)
class Source:
    """Where a fact was read: repository, file, commit (or package version)."""

    repo: str
    path: str
    version: str


@dataclass(frozen=True)
class Layout:
    """One head kind as one engine loads it."""

    format: str  # our --format name
    kind: str  # medusa | eagle | eagle3 | mtp
    engine: str
    weights_file: str
    architectures: tuple[str, ...] | None  # None: config.json must NOT carry "architectures"
    config: dict  # config.json field -> what it must hold
    tensors: tuple[Tensor, ...]
    sources: tuple[Source, ...]
    families: tuple[str, ...] = ()  # target model_types the layer can express; () = any
    traps: tuple[str, ...] = field(default=())


VLLM = "vllm-project/vllm"
SGLANG = "sgl-project/sglang"
TGI = "huggingface/text-generation-inference"

# A Llama-style decoder layer as HF names it (prefix "layers.0." or "midlayer."); q/k/v take
# `attn_in` features (H for EAGLE-1, 2H for EAGLE-3's [norm(emb); norm(h)]).
def llama_layer(prefix: str, attn_in: str, input_norm: bool) -> tuple[Tensor, ...]:
    p = prefix
    out = [
        Tensor(f"{p}self_attn.q_proj.weight", ("Q", attn_in)),
        Tensor(f"{p}self_attn.k_proj.weight", ("KV", attn_in)),
        Tensor(f"{p}self_attn.v_proj.weight", ("KV", attn_in)),
        Tensor(f"{p}self_attn.o_proj.weight", ("H", "Q")),
        Tensor(f"{p}self_attn.q_proj.bias", ("Q",), when="qkv_bias"),
        Tensor(f"{p}self_attn.k_proj.bias", ("KV",), when="qkv_bias"),
        Tensor(f"{p}self_attn.v_proj.bias", ("KV",), when="qkv_bias"),
        Tensor(f"{p}self_attn.o_proj.bias", ("H",), when="o_bias"),
        Tensor(f"{p}self_attn.q_norm.weight", ("D",), when="qk_norm"),
        Tensor(f"{p}self_attn.k_norm.weight", ("D",), when="qk_norm"),
        Tensor(f"{p}mlp.gate_proj.weight", ("I", "H")),
        Tensor(f"{p}mlp.up_proj.weight", ("I", "H")),
        Tensor(f"{p}mlp.down_proj.weight", ("H", "I")),
        Tensor(f"{p}post_attention_layernorm.weight", ("H",)),
    ]
    if input_norm:
        out.append(Tensor(f"{p}input_layernorm.weight", ("H",)))
    return tuple(out)


def eagle3_tensors(prefix: str) -> tuple[Tensor, ...]:
    """EAGLE-3: fc over three fused target layers, one layer over [input_layernorm(emb); hidden_norm(h)]."""
    return (
        (Tensor("fc.weight", ("H", "3H")), Tensor(f"{prefix}hidden_norm.weight", ("H",)), Tensor(f"{prefix}input_layernorm.weight", ("H",)))
        + llama_layer(prefix, "2H", input_norm=False)
        + (
            Tensor("norm.weight", ("H",)),
            Tensor("lm_head.weight", ("Vd", "H")),
            Tensor("d2t", ("Vd",), dtype="int64"),
            Tensor("t2d", ("V",), dtype="bool"),
        )
    )


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        format="vllm", kind="medusa", engine="vLLM (MedusaModel)", weights_file="model.safetensors",
        architectures=("MedusaModel",),
        config={
            "model_type": "medusa", "hidden_size": "H", "vocab_size": "V",
            "truncated_vocab_size": "V, or Vd < V: draft among token_map's tokens only",
            "num_heads": "K", "num_hidden_layers": "blocks per head",
            "medusa_fc_bias": "true (else the blocks are built without biases and the biases are dropped)",
            "original_lm_head": "true: one lm head shared by all heads, read from lm_heads.0.weight",
        },
        tensors=(
            Tensor("blocks.{h}.layers.{l}.weight", ("H", "H")),
            Tensor("blocks.{h}.layers.{l}.bias", ("H",)),
            Tensor("lm_heads.{h}.weight", ("V", "H")),  # shared head: only lm_heads.0.weight; Vd rows with token_map
            Tensor("token_map", ("Vd",), "int64", when="truncated_vocab_size < V"),  # target id of each lm head row
        ),
        sources=(
            Source(VLLM, "vllm/model_executor/models/medusa.py", "09cddad8f0324594022359cd2b07e962a14b895f"),
            Source(VLLM, "vllm/transformers_utils/configs/medusa.py", "0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f"),
            Source(VLLM, "vllm/v1/spec_decode/medusa.py", "afe4cc5a6cca6842620df36f6d02b43a224f4974"),
        ),
        traps=(
            "without medusa_fc_bias: true the residual blocks have no bias and the saved biases are skipped",
            "the config loader renames EVERY key containing 'num'+'heads' to num_heads and 'num'+'layers' to "
            "num_hidden_layers, so no other such key (num_attention_heads, num_key_value_heads) may appear",
            "the target's lm_head is not shared: the lm head weights must be in the folder",
            "weights not named blocks.* / lm_heads.* (or medusa_heads.-prefixed) are ignored",
            "token_map is read only when truncated_vocab_size < vocab_size; lm heads with more rows are cut to token_map's",
        ),
    ),
    Layout(
        format="tgi", kind="medusa", engine="TGI (MedusaHeadV2: shared lm_head)", weights_file="medusa_lm_head.safetensors",
        architectures=None,
        config={"medusa_num_heads": "K", "medusa_num_layers": "1", "base_model_name_or_path": "the target's id or path"},
        tensors=(Tensor("{h}.0.linear.weight", ("H", "H")), Tensor("{h}.0.linear.bias", ("H",))),
        sources=(
            Source(TGI, "server/text_generation_server/layers/medusa.py", "f32fdd0fa16411512f09a14d0304869b5aeba73c"),
            Source(TGI, "server/text_generation_server/layers/speculative.py", "c09f5bc93071e2701e201bb374d488e4673fac3d"),
            Source(TGI, "server/text_generation_server/models/__init__.py", "get_model(): medusa_num_heads branch"),
        ),
        traps=(
            "if config.json has 'architectures' (and it is not MLPSpeculatorPreTrainedModel) the Medusa heads are not loaded",
            "MedusaHeadV2 asserts medusa_num_layers == 1",
            "MedusaHeadV1 is tried first and wins when {h}.1.weight exists: keep the shared layout free of it",
        ),
    ),
    Layout(
        format="tgi", kind="medusa-own", engine="TGI (MedusaHeadV1: own lm heads)", weights_file="medusa_lm_head.safetensors",
        architectures=None,
        config={"medusa_num_heads": "K", "medusa_num_layers": "L", "base_model_name_or_path": "the target's id or path"},
        tensors=(
            Tensor("{h}.{l}.linear.weight", ("H", "H")),
            Tensor("{h}.{l}.linear.bias", ("H",)),
            Tensor("{h}.{L}.weight", ("V", "H")),  # the head's own lm head, right after its L blocks
        ),
        sources=(Source(TGI, "server/text_generation_server/layers/medusa.py", "f32fdd0fa16411512f09a14d0304869b5aeba73c"),),
        traps=("same 'architectures' trap as the shared layout; this is also the Medusa v0.1 reference layout",),
    ),
    Layout(
        format="vllm", kind="eagle", engine="vLLM (EagleLlamaForCausalLM)", weights_file="model.safetensors",
        architectures=("EagleLlamaForCausalLM",),
        config={
            "model_type": "llama", "num_hidden_layers": "1", "attention_bias": "true when biases are folded in",
            "qkv_bias": "true when q/k/v carry biases", "tie_word_embeddings": "the target's",
            "(rest)": "the target's attention/MLP/rope/norm fields",
        },
        tensors=(Tensor("fc.weight", ("H", "2H")),) + llama_layer("layers.0.", "H", input_norm=False),
        families=("llama", "mistral", "qwen2"),
        sources=(
            Source(VLLM, "vllm/model_executor/models/llama_eagle.py", "e1c4a55214c63e19e83f82ad6c552d82148bae0b"),
            Source(VLLM, "vllm/model_executor/models/llama_eagle.py", "00da92319af4b2ad2cde8525b7b609c779bdc52f"),
            Source(VLLM, "vllm/model_executor/models/llama.py", "e06c9ba2a6ea923a84add30f5dafaea126429b81"),
            Source(VLLM, "vllm/transformers_utils/configs/eagle.py", "23c5aa92d517802488a0c77a5f58cd0a2019c5a3"),
        ),
        traps=(
            "fc is built with bias=False: fc.bias is a KeyError in one version and silently skipped in another; "
            "export folds the fc bias into the attention biases (exact) instead",
            "the layer's attention_bias gives q/k/v AND o_proj biases; qkv_bias overrides the q/k/v part only",
            "embed_tokens and lm_head are taken from the target (pipeline parallelism off): not needed in the folder",
            "EAGLE-1 architectures registered: EagleLlamaForCausalLM (+ Llama4, MiniCPM); no Qwen2/Qwen3 EAGLE-1 class",
        ),
    ),
    Layout(
        format="sglang", kind="eagle", engine="SGLang (LlamaForCausalLMEagle / Qwen2ForCausalLMEagle)",
        weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle",),  # Qwen2ForCausalLMEagle for a qwen2 target
        config={"num_hidden_layers": "1", "(rest)": "the target's config with its model_type"},
        tensors=(Tensor("fc.weight", ("H", "2H")), Tensor("fc.bias", ("H",))) + llama_layer("layers.0.", "H", input_norm=False),
        families=("llama", "mistral", "qwen2"),
        sources=(
            Source(SGLANG, "python/sglang/srt/models/llama_eagle.py", "3b64d5dee0756de843b5f022966f69c995cd15ea"),
            Source(SGLANG, "python/sglang/srt/models/qwen2_eagle.py", "088a7eafdf9c119c5376056db011e29e187bd498"),
        ),
        traps=(
            "fc always has a bias (nn.Linear default): a folder without fc.bias leaves it uninitialised",
            "layer 0's input_layernorm is replaced by the identity; names that match nothing are dropped without a warning",
            "embed_tokens and lm_head are replaced by the target's at start-up",
        ),
    ),
    Layout(
        format="vllm", kind="eagle3", engine="vLLM (Eagle3LlamaForCausalLM / LlamaForCausalLMEagle3)",
        weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle3",),
        config={
            "model_type": "llama", "num_hidden_layers": "1", "draft_vocab_size": "Vd", "target_hidden_size": "H",
            "eagle_aux_hidden_state_layer_ids": "hidden_states indices: layer l's OUTPUT is id l + 1",
            "norm_before_residual": "false (the residual is the un-normed fc output)",
            "tie_word_embeddings": "false",
        },
        tensors=eagle3_tensors("midlayer."),
        families=("llama", "mistral"),
        sources=(
            Source(VLLM, "vllm/model_executor/models/llama_eagle3.py", "583507d13075783a12ccbd774575974d10ca4959"),
            Source(VLLM, "vllm/model_executor/models/llama.py", "e06c9ba2a6ea923a84add30f5dafaea126429b81"),
        ),
        traps=(
            "q/k/v are built with bias=False: a Qwen2-style layer cannot be expressed",
            "aux ids are taken BEFORE layer id runs (input of layer id = output of layer id-1); default (2, N//2, N-3)",
            "d2t holds offsets: target_id = draft_id + d2t[draft_id]; t2d is skipped",
            "midlayer.* is renamed to layers.0.*",
        ),
    ),
    Layout(
        format="sglang", kind="eagle3", engine="SGLang (LlamaForCausalLMEagle3)", weights_file="model.safetensors",
        architectures=("LlamaForCausalLMEagle3",),
        config={
            "model_type": "llama", "num_hidden_layers": "1 (anything else raises)", "draft_vocab_size": "Vd",
            "target_hidden_size": "H", "tie_word_embeddings": "false (true makes lm_head the full-vocab embedding)",
            "eagle_config": "{'eagle_aux_hidden_state_layer_ids': [l, ...]}: target layer OUTPUTS (SGLang adds 1)",
        },
        tensors=eagle3_tensors("midlayer."),
        families=("llama", "mistral"),
        sources=(
            Source(SGLANG, "python/sglang/srt/models/llama_eagle3.py", "d737979cbd17c6162f39c1953cfa72d3d23cc0d0"),
            Source(SGLANG, "python/sglang/srt/models/llama.py", "set_eagle3_layers_to_capture: [val + 1 for val in layer_ids]"),
        ),
        traps=(
            "tie_word_embeddings true with a smaller draft vocabulary: lm_head becomes the embedding",
            "explicit aux ids are layer outputs (+1 internally) but the default [2, N//2, N-3] is raw",
            "weights whose names match nothing are skipped silently; d2t offsets become hot_token_id",
        ),
    ),
    Layout(
        format="speculators", kind="eagle3", engine="speculators 0.9.0 / vLLM speculators loader",
        weights_file="model.safetensors",
        architectures=("Eagle3Speculator",),
        config={
            "speculators_model_type": "eagle3", "transformer_layer_config": "the layer's config (model_type llama or qwen3)",
            "speculators_config": "{algorithm, proposal_methods: [{proposal_type: greedy, speculative_tokens}], "
            "default_proposal_method, verifier: {name_or_path, architectures}}",
            "draft_vocab_size": "Vd", "target_hidden_size": "H", "norm_before_residual": "false, written explicitly",
            "eagle_aux_hidden_state_layer_ids": "hidden_states indices (as vLLM): layer l's output is l + 1",
        },
        tensors=eagle3_tensors("layers.0."),
        families=("llama", "mistral", "qwen3"),
        sources=(
            Source("vllm-project/speculators", "src/speculators/config.py", "PyPI speculators==0.9.0"),
            Source("vllm-project/speculators", "src/speculators/model.py", "PyPI speculators==0.9.0"),
            Source("vllm-project/speculators", "src/speculators/models/eagle3/core.py", "PyPI speculators==0.9.0"),
            Source(VLLM, "vllm/transformers_utils/configs/speculators/base.py", "94699746757f9d68e2f4bd89ad2c4b10ed962457"),
            Source(VLLM, "vllm/transformers_utils/configs/speculators/algos.py", "stored file id 54858736156"),
        ),
        traps=(
            "the speculators model starts lm_head/embeddings as NaN and keeps NaN for anything not loaded",
            "vLLM's speculators path defaults norm_before_residual to TRUE when the key is absent (speculators: false)",
            "only transformer_layer_config.model_type llama or qwen3 has an EAGLE-3 first-layer class",
            "speculators 0.9.0 has no EAGLE-1 model type",
        ),
    ),
    Layout(
        format="deepseek-mtp", kind="mtp", engine="vLLM (DeepSeekMTPModel)", weights_file="model.safetensors",
        architectures=("DeepseekV3ForCausalLM",),
        config={"num_nextn_predict_layers": "D", "(rest)": "the target's DeepSeek-V3 config (the target loads the same folder)"},
        tensors=(
            Tensor("model.layers.{k}.enorm.weight", ("H",)),
            Tensor("model.layers.{k}.hnorm.weight", ("H",)),
            Tensor("model.layers.{k}.eh_proj.weight", ("H", "2H")),  # input [enorm(emb); hnorm(h)]: embedding FIRST
            Tensor("model.layers.{k}.shared_head.norm.weight", ("H",)),
            Tensor("model.layers.{k}.shared_head.head.weight", ("V", "H")),
            Tensor("model.layers.{k}.embed_tokens.weight", ("V", "H")),
        ),
        families=("deepseek_v3",),
        sources=(Source(VLLM, "vllm/model_executor/models/deepseek_mtp.py", "4f7c14402630b97c8c078523fca8edef287ed2cf"),),
        traps=(
            "the MTP block is a DeepseekV2DecoderLayer (MLA + MoE): a Llama-family block has no engine that loads it",
            "modules live at layer index num_hidden_layers + k; block weights sit beside enorm/hnorm/eh_proj",
            "module k is built as layer N+k, so with first_k_dense_replace <= N+k it is a MoE layer (per-expert "
            "weights mlp.experts.{e}.*); a copy of layer 0 is dense when first_k_dense_replace > 0",
            "embeddings at position 0 are zeroed; the MTP input is [enorm(emb); hnorm(h)] (ours is [hnorm(h); enorm(emb)])",
        ),
    ),
)


def layouts_for(kind: str) -> list[Layout]:
    return [layout for layout in LAYOUTS if layout.kind == kind or (kind == "medusa" and layout.kind == "medusa-own")]


def find(fmt: str, kind: str) -> Layout | None:
    return next((layout for layout in LAYOUTS if layout.format == fmt and layout.kind == kind), None)
