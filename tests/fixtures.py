"""Tiny random targets and tokenizers built from configs: no downloads, seconds to build.

Families: llama, qwen2, mistral, qwen3. Tokenizers are byte-level BPE trained here on a
small corpus, with the special tokens and chat template of a real family (ChatML as
SmolLM2/Qwen2 use it, Llama-3).
"""

from __future__ import annotations

import functools

import torch
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
