"""Tiny random targets and tokenizers built from configs: no downloads, seconds to build.

Families: llama, qwen2, mistral, qwen3. Tokenizers are byte-level BPE trained here on a
small corpus, with the special tokens and chat template of a real family (ChatML as
SmolLM2/Qwen2 use it, Llama-3).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

FAMILIES = ("llama", "qwen2", "mistral", "qwen3")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2 adds a default system turn when the conversation has none.
QWEN2 = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    + CHATML
)
LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
TEMPLATES = {
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>", None),
    "qwen2": (QWEN2, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"], "<|im_end|>", None),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>",
               "<|begin_of_text|>"),
}

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens cheaply and verifies them in one forward pass.",
    "for i in range(10):\n    print(i * i)\n",
    "Write a function that returns the sum of a list of numbers.",
    "import numpy as np\nx = np.zeros((3, 4))\n",
    "Hello! How can I help you today? I can answer questions about code and math.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
] * 4


@functools.cache
def _trained_tokenizer(specials: tuple[str, ...], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def make_tokenizer(template: str = "chatml", vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer with a real family's specials and chat template."""
    chat_template, specials, eos, bos = TEMPLATES[template]
    tok = _trained_tokenizer(tuple(specials), vocab_size)
    out = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), eos_token=eos, bos_token=bos)
    out.pad_token = eos
    out.chat_template = chat_template
    return out


def make_base_tokenizer() -> PreTrainedTokenizerFast:
    """A base model's tokenizer: Llama-3's specials, no chat template, and BOS put before every text it encodes."""
    tok = make_tokenizer("llama3")
    tok.chat_template = None
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    return tok


def make_config(family: str, vocab_size: int, **overrides):
    """A transformers config for a tiny model of `family` (4 layers, hidden 64)."""
    from transformers import AutoConfig

    sizes = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    if family in ("qwen3", "gemma"):   # Gemma's default head_dim is 256
        sizes["head_dim"] = 16
    sizes.update(overrides)
    return AutoConfig.for_model(family, **sizes)


def make_target(family: str = "llama", tokenizer=None, seed: int = 0, attn: str = "sdpa", **overrides):
    """A frozen, eval-mode tiny random causal LM of `family` (fp32, CPU)."""
    tokenizer = tokenizer or make_tokenizer()
    config = make_config(family, len(tokenizer), **overrides)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    # Sharper than the default init so greedy choices are well separated and tests are stable.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.requires_grad_(False).eval()
    return model


# ---- checkpoints that ship MTP layers -------------------------------------------------------------------------------

QWEN_MTP = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


def shipped_mtp_checkpoint(config, tokenizer, folder, seed: int = 0) -> Path:
    """Save a tiny model of `config` (N + 1 layers) whose last layer becomes the MTP layer its release ships, in the
    real key layout: transformers' own save_pretrained writes it (sharded, per-expert MoE keys), then the last layer
    stays at model.layers.{N} with NextN's enorm, hnorm, eh_proj and shared_head (DeepSeek-V3, GLM-4.5), or is
    renamed mtp.layers.0 beside mtp.fc, mtp.pre_fc_norm_* and mtp.norm (Qwen3-Next, Qwen3.5), and config.json says
    N layers. Nothing here uses draftheads' own key mapping."""
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(config, name, getattr(tokenizer, name))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    folder = Path(folder)
    model.save_pretrained(folder, max_shard_size="200KB")
    tokenizer.save_pretrained(folder)
    _make_last_layer_mtp(folder, model, seed)
    return folder


def _make_last_layer_mtp(folder: Path, model, seed: int) -> None:
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    layers = model.config.num_hidden_layers - 1
    prefix, hidden = f"model.layers.{layers}.", model.config.hidden_size
    qwen = model.config.model_type in QWEN_MTP
    mimo = model.config.model_type == "mimo_v2_flash"
    g = torch.Generator().manual_seed(seed + 1)

    def norm():   # Qwen's norms are 1 + w (w starts at 0); NextN's are w (starts at 1)
        return torch.randn(hidden, generator=g) * 0.1 + (0.0 if qwen else 1.0)

    proj = torch.randn(hidden, 2 * hidden, generator=g) * 0.05
    if qwen:
        extra = {"mtp.fc.weight": proj, "mtp.pre_fc_norm_embedding.weight": norm(),
                 "mtp.pre_fc_norm_hidden.weight": norm(), "mtp.norm.weight": norm()}
        rename = {k: "mtp.layers.0." + k[len(prefix):] for k in index["weight_map"] if k.startswith(prefix)}
    elif mimo:   # three MTP layers under model.mtp.layers, vLLM's names (mimo_v2_mtp.py); copies of one layer
        extra, rename = {}, {}
        for i in range(3):
            mtp = f"model.mtp.layers.{i}."
            extra.update({mtp + "enorm.weight": norm(), mtp + "hnorm.weight": norm(),
                          mtp + "eh_proj.weight": proj.clone(), mtp + "final_layernorm.weight": norm()})
        rename = {k: "model.mtp.layers.0." + k[len(prefix):].replace("post_attention_layernorm.", "pre_mlp_layernorm.")
                  for k in index["weight_map"] if k.startswith(prefix)}
    else:
        extra = {prefix + "enorm.weight": norm(), prefix + "hnorm.weight": norm(), prefix + "eh_proj.weight": proj,
                 prefix + "shared_head.norm.weight": norm(),
                 prefix + "shared_head.head.weight": model.lm_head.weight.detach().clone(),
                 prefix + "embed_tokens.weight": model.get_input_embeddings().weight.detach().clone()}
        rename = {}
    for file in sorted({index["weight_map"][k] for k in rename}):
        tensors = load_file(str(folder / file))
        save_file({rename.get(k, k): v for k, v in tensors.items()}, str(folder / file), metadata={"format": "pt"})
    if mimo:   # layers 1 and 2: the layer again, in the file of its own
        first = {rename[k]: load_file(str(folder / index["weight_map"][k]))[rename[k]] for k in rename}
        extra.update({k.replace(".layers.0.", f".layers.{i}."): v.clone() for i in (1, 2) for k, v in first.items()})
    index["weight_map"] = {rename.get(k, k): v for k, v in index["weight_map"].items()}
    save_file(extra, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    index["weight_map"].update({k: "model-mtp.safetensors" for k in extra})
    index_file.write_text(json.dumps(index, indent=2))
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = layers
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:layers]
    if "mlp_layer_types" in config:
        config["mlp_layer_types"] = config["mlp_layer_types"][:layers]
    if not mimo:   # MiMo-V2's config names no count (llama.cpp's converter hardcodes 3)
        config["mtp_num_hidden_layers" if qwen else "num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def shipped_assistant_folder(target, folder, seed: int = 0, ordered: bool = True, hidden: int = 32, layers: int = 2,
                             **geometry) -> Path:
    """Save a tiny Gemma 4 assistant for the Gemma 4 `target` into `folder`, as transformers' save_pretrained writes
    one: its layers read the target's keys and values, so `geometry` (heads, head sizes, window, rope) is the
    target's (the defaults: tests/families.py's gemma4); `ordered`: with the centroid-masked lm_head (8 centroids, a
    random token ordering)."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4_assistant import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    t = target.config
    shape = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=64)
    shape.update(geometry)
    text = Gemma4TextConfig(vocab_size=t.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, max_position_embeddings=t.max_position_embeddings,
                            layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                            rope_parameters=t.rope_parameters, hidden_size_per_layer_input=0,
                            vocab_size_per_layer_input=0, num_kv_shared_layers=layers, tie_word_embeddings=True,
                            **shape)
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=t.hidden_size, use_ordered_embeddings=ordered,
                                   num_centroids=8, centroid_intermediate_top_k=2)
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(config).eval()
    with torch.no_grad():
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(t.vocab_size))
        model.lm_head.weight.mul_(8.0)   # sharper, as the targets' are
    model.generation_config.num_assistant_tokens = 3
    model.save_pretrained(folder)
    return Path(folder)
