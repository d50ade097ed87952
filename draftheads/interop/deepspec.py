"""DeepSpec's DSpark layout (`Qwen3DSparkModel`), which DeepSpec's own evaluator and vLLM's `dspark` method load,
written and read back.

DeepSpec (deepseek-ai/DeepSpec) saves a drafter with transformers' save_pretrained: a Qwen3 config carrying the
target's sizes and the DSpark fields, and one safetensors file whose names have no `model.` prefix. Our DSpark's
native names are already its names (layers.*, fc, hidden_norm, norm, markov_head.markov_w{1,2}, confidence_head.proj),
and its block convention is DeepSpec's: [pending, M, ..., M], every slot drafting, so B drafts per block.

What DeepSpec's folder adds: the target's embedding and whole lm_head as `embed_tokens.weight` and `lm_head.weight`
(its model owns frozen copies of both), and no draft vocabulary at all: its Markov W2 and lm_head cover every token.
A drafter trained with `head.draft_vocab_size` drafts among fewer tokens, which no DeepSpec weight can express (a
low-rank bias cannot rule a token out), so it is refused here; vLLM's dialect of the same layout takes a draft
vocabulary (interop/vllm.py) and is the format for it.
"""

from __future__ import annotations

import shlex

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import target_dims
from draftheads.heads.parts import draft_vocab
from draftheads.interop.dflash_layout import check_shared_rows, dflash_tensors, dflash_to_engine, refuse_other_dspark
from draftheads.interop.eagle_layout import engine_layer_config
from draftheads.interop.layout import Layout, LoaderFile, Tensor
from draftheads.interop.native import SavedDrafter

DEEPSPEC = "deepseek-ai/DeepSpec"
COMMIT = "afdfa7c9382a3341a3e6f17756dd816da79f132c"
ARCHITECTURE = "Qwen3DSparkModel"
# anchors per row in DeepSpec's training configs: its model's constructor requires the key, inference never reads it
NUM_ANCHORS = 512
# targets whose transformers embedding module applies a scale itself (ScaledWordEmbedding): our drafter embedded its
# block through it, while DeepSpec's model holds a plain nn.Embedding of the same table
SCALED_EMBEDDING = {"gemma3": "sqrt(hidden_size)", "gemma3_text": "sqrt(hidden_size)",
                    "gemma4": "sqrt(hidden_size)", "gemma4_text": "sqrt(hidden_size)"}

MARKOV_AND_CONFIDENCE = (
    Tensor("markov_head.markov_w1.weight", ("V", "r"), when="markov_rank > 0"),
    Tensor("markov_head.markov_w2.weight", ("Vd", "r"), when="markov_rank > 0"),
    Tensor("confidence_head.proj.weight", ("1", "H+r"), when="confidence head (H alone without its Markov input)"),
    Tensor("confidence_head.proj.bias", ("1",), when="confidence head"),
)

LAYOUTS = (
    Layout(
        format="deepspec", kind="dspark", engine="DeepSpec (Qwen3DSparkModel, its eval.py)",
        weights_file="model.safetensors",
        architectures=(ARCHITECTURE,),
        config={
            "model_type": "qwen3", "(rest)": "the target's sizes, rope and vocabulary (DeepSpec copies the target's "
                                             "config)",
            "num_hidden_layers": "L", "layer_types": "['full_attention'] * L", "tie_word_embeddings": "false",
            "block_size": "B: every slot of [anchor, M, ..., M] drafts", "mask_token_id": "the mask slots' token",
            "target_layer_ids": "target layer OUTPUTS (id i is hidden_states[i + 1]), never the last layer",
            "num_target_layers": "the target's layers", "num_anchors": "required by the constructor, unused here",
            "markov_rank": "r", "markov_head_type": "vanilla",
            "enable_confidence_head": "bool", "confidence_head_with_markov": "bool",
        },
        tensors=dflash_tensors(own_lm_head=False) + (
            Tensor("embed_tokens.weight", ("V", "H")), Tensor("lm_head.weight", ("V", "H"))) + MARKOV_AND_CONFIDENCE,
        read_from=(
            LoaderFile(DEEPSPEC, "deepspec/modeling/dspark/qwen3/config.py (build_draft_config)", COMMIT),
            LoaderFile(DEEPSPEC, "deepspec/modeling/dspark/qwen3/modeling.py (Qwen3DSparkModel)", COMMIT),
            LoaderFile(DEEPSPEC, "deepspec/modeling/dspark/markov_head.py", COMMIT),
            LoaderFile(DEEPSPEC, "deepspec/modeling/dspark/common.py (AcceptRatePredictor, extract_context_feature)",
                       COMMIT),
            LoaderFile(DEEPSPEC, "deepspec/eval/dspark/evaluator.py, eval.py", COMMIT),
            LoaderFile(DEEPSPEC, "deepspec/trainer/ckpt_manager.py (save_pretrained)", COMMIT),
        ),
        traps=(
            "no draft vocabulary: W2 and lm_head cover the target's whole vocabulary",
            "embed_tokens and lm_head are loaded from the folder, not shared: missing ones stay at a random init "
            "with only a warning",
            "the constructor asserts target_layer_ids, mask_token_id, num_anchors, enable_confidence_head and "
            "markov_rank are present (markov_head_type when r > 0, confidence_head_with_markov with the head)",
            "eval.py picks its evaluator by architectures[0]; the last target layer is refused (HF's is normed)",
        ),
    ),
)


def dspark_config(s: SavedDrafter) -> dict:
    """config.json of a SavedDrafter `s` (a DSpark head) as DeepSpec writes it: the target's sizes in a Qwen3 config
    with the DSpark fields, every one explicit (vLLM reads the same keys, some with defaults other than DeepSpec's)."""
    head = s.head
    layers = head.num_layers
    return engine_layer_config(
        s.target_config(), "qwen3", [ARCHITECTURE], s.dtype, num_hidden_layers=layers,
        layer_types=["full_attention"] * layers, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
        block_size=head.block_size, mask_token_id=head.mask_token_id, target_layer_ids=list(head.target_layers),
        num_target_layers=int(s.config["target"]["num_layers"]), num_anchors=NUM_ANCHORS,
        markov_rank=head.markov_rank, markov_head_type="vanilla", enable_confidence_head=head.confidence,
        confidence_head_with_markov=head.confidence and head.confidence_with_markov)


def write_dspark(s: SavedDrafter):
    """Qwen3DSparkModel as DeepSpec saves it: our tensors, the target's embedding and lm_head beside them."""
    tensors = {**dflash_to_engine(s, own_lm_head=False), "embed_tokens.weight": s.target_embedding().to(s.dtype),
               "lm_head.weight": s.target_lm_head().to(s.dtype)}
    return tensors, dspark_config(s), "model.safetensors"


def refusal(saved: SavedDrafter) -> str | None:
    """DeepSpec drafts over the whole vocabulary and embeds with a plain table (the Markov bias on transformed logits:
    export.refusal, for every engine)."""
    if saved.head.draft_vocab_size is not None:
        return (f"DeepSpec's Qwen3DSparkModel drafts over the target's whole vocabulary and this drafter among "
                f"{saved.head.draft_vocab_size} tokens (head.draft_vocab_size); export it as 'vllm', whose dspark "
                "method takes a draft vocabulary, or train with head.draft_vocab_size unset")
    scale = SCALED_EMBEDDING.get(saved.family)
    if scale:
        return (f"DeepSpec's Qwen3DSparkModel embeds the block with a plain copy of the embedding table, without the "
                f"{scale} the {saved.family} target's embedding applies and this drafter was trained with")
    return None


WRITERS = {"dspark": write_dspark}


def serve_command(s: SavedDrafter, model: str, target: str) -> str:
    """DeepSpec's own evaluation of the folder beside its target, from a DeepSpec checkout."""
    return f"python eval.py --target_name_or_path {shlex.quote(target)} --draft_name_or_path {shlex.quote(model)}"


def read_dspark(config: dict, tensors: dict, target) -> tuple[dict, dict]:
    """(head structure, native state) of a Qwen3DSparkModel folder in DeepSpec's dialect or vLLM's (a draft
    vocabulary as lm_head rows and d2t), checked against `target`: its embedding and lm_head must be the target's."""
    rank = int(config.get("markov_rank") or 0)
    refuse_other_dspark(config, rank, "this DSpark folder")
    layers, mask = target_layer_ids(config), mask_token(config)
    missing = [name for name, value in (("target_layer_ids", layers), ("block_size", config.get("block_size")),
                                        ("mask_token_id", mask)) if value is None]
    if missing:
        raise DraftheadsError(f"this DSpark folder's config.json lacks {', '.join(missing)}; without them the drafter "
                              "cannot be run as it was trained (write them into config.json)")
    dims = target_dims(target.config)
    own = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")
    state = {k: v for k, v in tensors.items() if k not in own}
    head = {"type": "dspark", "block_size": int(config["block_size"]), "num_layers": int(config["num_hidden_layers"]),
            "target_layers": layers, "mask_token_id": int(mask), "markov_rank": rank}
    check_same(tensors.get("embed_tokens.weight"), target.get_input_embeddings().weight, "embedding")
    if "d2t" in tensors:
        head["draft_vocab_size"] = int(tensors["d2t"].shape[0])
        if "lm_head.weight" in tensors:
            check_shared_rows(tensors["lm_head.weight"], tensors["d2t"], target)
        state["d2t"] = tensors["d2t"]
        state["t2d"] = draft_vocab.members(tensors["d2t"], dims.vocab_size)
    else:
        check_same(tensors.get("lm_head.weight"), target.get_output_embeddings().weight, "lm_head")
    proj = tensors.get("confidence_head.proj.weight")
    confidence = bool(config.get("enable_confidence_head")) and proj is not None
    head["confidence"] = confidence
    # its input is [h; W1[prev]] or h alone: the shape says which, whatever defaults the config leaves to a loader
    head["confidence_with_markov"] = confidence and rank > 0 and proj.shape[1] == dims.hidden_size + rank
    if not confidence:
        state = {k: v for k, v in state.items() if not k.startswith("confidence_head.")}
    return head, state


def target_layer_ids(config: dict) -> list[int] | None:
    """The target layers whose outputs the drafter reads, in DeepSpec's numbering (layer i's output is id i), found
    where vLLM looks, in its order: its own aux ids (one higher), then DFlash's, DSpark's and the top-level key."""
    if config.get("eagle_aux_hidden_state_layer_ids") is not None:
        return [int(i) - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]
    for ids in ((config.get("dflash_config") or {}).get("target_layer_ids"), config.get("dspark_target_layer_ids"),
                config.get("target_layer_ids")):
        if ids is not None:
            return [int(i) for i in ids]
    return None


def mask_token(config: dict) -> int | None:
    """The mask slots' token, found where vLLM looks for it, in its order."""
    found = [(config.get("dflash_config") or {}).get("mask_token_id"), config.get("mask_token_id"),
             config.get("dspark_noise_token_id")]
    return next((token for token in found if token is not None), None)


def check_same(tensor: torch.Tensor | None, mine: torch.Tensor, what: str) -> None:
    """Our DSpark uses the target's own embedding and lm_head: a folder carrying other ones cannot run that way."""
    if tensor is None:
        return
    if tuple(tensor.shape) != tuple(mine.shape) or not torch.allclose(
            tensor.float(), mine.detach().cpu().float(), atol=1e-2, rtol=1e-2):
        raise DraftheadsError(f"this DSpark folder's {what} is not the target's (another target's, or trained); "
                              "draftheads' DSpark shares the target's, so it cannot be loaded for this target")
