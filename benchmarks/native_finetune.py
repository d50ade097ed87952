"""A shipped drafter against the same drafter fine-tuned for another kind of text, on tiny checkpoints of each family
that ships one (head.type native: an MTP layer; assistant: Gemma 4's assistant folder), and what putting it back costs.

    .venv/bin/python -m benchmarks.native_finetune [--steps 80] [--families deepseek_v3,qwen3_5]
    .venv/bin/python -m benchmarks.native_finetune --gpu-estimate

Per family: a tiny checkpoint whose MTP layer starts random (tests/fixtures.shipped_mtp_checkpoint; for Gemma 4, a
random assistant folder, shipped_assistant_folder) is "released": its drafter trained on the target's continuations of
general prose prompts and put back into a copy of the checkpoint (export --format checkpoint; --format assistant).
That release is the shipped drafter. It is then fine-tuned, the same steps, on the target's continuations of code
prompts, and, as a control, the same steps more on prose; all are measured on held-out code and prose prompts: tau of
a greedy chain of `depth`. Also printed: the bytes put-back rewrote against the checkpoint's size, and whether the
original checkpoint's files hash the same after both put-backs.

--gpu-estimate prints instead what a GPU fine-tune of each family's released size would need, counted on the meta
device from transformers' own default configs (which are those releases' sizes): the drafter's parameters, active
ones per token, memory per GPU and minutes per 10k rows. The minutes are arithmetic, not a measurement: FLOPs per
token (target forward 2·A_target when features are made online; per draft step 6·A_drafter when all trains, 4·A when
only the fusion does, and 4·V·H for the frozen lm_head forward and input gradient) over 40% of an H100's 989 dense
bf16 TFLOP/s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from transformers import DeepseekV3Config, Glm4MoeConfig, Qwen3NextConfig
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

from draftheads.core.tree import Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.heads.factory import head_config, new_drafter
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter
from draftheads.interop.assistant_folder import shipped_assistant
from draftheads.interop.shipped_mtp import shipped_drafter
from draftheads.training.features import target_features
from tests.fixtures import make_config, make_tokenizer, shipped_assistant_folder, shipped_mtp_checkpoint

MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
HYBRID_TYPES = ["linear_attention", "full_attention"] * 2 + ["full_attention"]
SIZES = {   # model_type -> overrides of the fixture sizes (5 layers: the last becomes the shipped MTP layer)
    "deepseek_v3": dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        head_dim=8, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                        topk_group=1, num_key_value_heads=4, **MOE),
    "glm4_moe": dict(head_dim=16, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                     topk_group=1, **MOE),
    "qwen3_next": dict(head_dim=16, num_experts=4, shared_expert_intermediate_size=32, layer_types=HYBRID_TYPES,
                       **LINEAR, **MOE),
    "qwen3_5_text": dict(head_dim=16, layer_types=HYBRID_TYPES, **LINEAR),
    # the last layer (the shipped MTP one) sliding-window with a dense MLP, as MiMo-V2's are
    "mimo_v2_flash": dict(head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, sliding_window=8,
                          layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                                       "sliding_attention"], mlp_layer_types=["dense", "sparse", "sparse", "sparse",
                                                                              "dense"]),
    # a Gemma 4 target (per-layer embeddings, local and global layers) with a 2-layer assistant beside it
    "gemma4_text": dict(head_dim=16, global_head_dim=32, sliding_window=64, hidden_size_per_layer_input=8,
                        vocab_size_per_layer_input=384, layer_types=["sliding_attention", "full_attention"] * 2),
}
PROSE = ["The weather today is", "She walked into the room and", "The history of the city begins",
         "In the morning we usually", "My favourite book tells of", "The river flows past the old",
         "Every summer the village holds", "He opened the letter and read", "The museum shows paintings of",
         "After dinner the family sat", "The train left the station at", "Our neighbours planted a garden",
         "The teacher asked the class to", "On the hill stands a small", "During the storm the sailors",
         "The market sells fresh bread and"]
CODE = ["def add(a, b):", "for i in range(10):", "import numpy as np", "class Stack:", "while x > 0:",
        "return sorted(items, key=", "if __name__ == '__main__':", "def parse(line):", "with open(path) as f:",
        "try:\n    value = int(s)", "lambda x: x * 2", "print(f'{name}: {value}')", "def fib(n):",
        "for key, value in d.items():", "class Node:\n    def __init__(self", "assert len(result) =="]
TRAIN = 10   # prompts of each kind trained on; the other 6 are held out
NEW_TOKENS = 32


def continuations(target, tokenizer, texts, seed: int) -> list[tuple[list[int], int]]:
    """(prompt + the target's sampled continuation, prompt length) for each text: the target's own data."""
    out = []
    for i, text in enumerate(texts):
        prompt = torch.tensor(tokenizer(text)["input_ids"])
        row = speculative_generate(target, None, prompt, NEW_TOKENS, temperature=0.8, seed=seed + i, eos_token_id=[])
        out.append((prompt.tolist() + row.rows[0], len(prompt)))
    return out


def batch_of(target, rows, layers) -> dict:
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in rows])
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    loss_mask = attention.clone()
    for r, (_, prompt) in enumerate(rows):
        loss_mask[r, :prompt] = 0
    batch = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}
    batch["features"] = target_features(target, input_ids, attention, layers)
    return batch


def train(drafter, batch, steps: int, lr: float = 3e-3) -> None:
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=lr)
    drafter.train()
    for _ in range(steps):
        loss, _ = drafter.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval()


def tau(target, drafter, tokenizer, texts, depth: int) -> float:
    emitted = steps = 0
    for text in texts:
        prompt = torch.tensor(tokenizer(text)["input_ids"])
        stats = speculative_generate(target, drafter, prompt, NEW_TOKENS, tree=Tree.chain(depth),
                                     eos_token_id=[]).stats
        emitted, steps = emitted + sum(stats.step_emitted), steps + stats.steps
    return emitted / steps


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def load(folder: Path):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).requires_grad_(False).eval()


def ship(kind: str, target, source: Path, depth: int):
    """The drafter `source` ships for `target`: a checkpoint's MTP layer, or a Gemma 4 assistant folder's."""
    if kind == "native":
        return shipped_drafter(target, head_config({"type": "native", "depth": depth}))
    return shipped_assistant(target, head_config({"type": "assistant", "source": str(source), "depth": depth}))


def put_back(drafter, target, source: Path, root: Path, name: str, kind: str) -> Path:
    """The drafter written back where it came from: a copy of the checkpoint, or an assistant folder."""
    if kind == "native":   # the checkpoint is the target's own folder
        target.name_or_path = str(source)
    saved = save_drafter(drafter, root / f"{name}-drafter", target=target)
    return export_drafter(str(saved), "checkpoint" if kind == "native" else "assistant", root / name)


def run_family(model_type: str, root: Path, steps: int, depth: int, seed: int) -> dict:
    tokenizer = make_tokenizer()
    kind = "assistant" if model_type == "gemma4_text" else "native"
    layers = 4 if kind == "assistant" else 5   # a shipped MTP layer is the last of 5
    config = make_config(model_type, len(tokenizer), num_hidden_layers=layers, **SIZES[model_type])
    if kind == "native":
        original = shipped_mtp_checkpoint(config, tokenizer, root / "original", seed)
        target = load(original)
    else:
        torch.manual_seed(seed)
        target = AutoModelForCausalLM.from_config(config, dtype=torch.float32).requires_grad_(False).eval()
        target.get_output_embeddings().weight.mul_(8.0)   # sharpened as the fixtures' targets are
        target.save_pretrained(root / "target")   # the folder the drafters record as their target
        target.name_or_path = str(root / "target")
        original = shipped_assistant_folder(target, root / "original", seed)
    before = digests(original)
    train_prose, held_prose = PROSE[:TRAIN], PROSE[TRAIN:]
    train_code, held_code = CODE[:TRAIN], CODE[TRAIN:]
    drafter = ship(kind, target, original, depth)
    torch.manual_seed(0)
    train(drafter, batch_of(target, continuations(target, tokenizer, train_prose, 0), drafter.feature_layers), steps)
    release = put_back(drafter, target, original, root, "release", kind)
    released = load(release) if kind == "native" else target
    shipped, tuned, more = (ship(kind, released, release, depth) for _ in range(3))
    torch.manual_seed(0)
    train(tuned, batch_of(released, continuations(released, tokenizer, train_code, 100), tuned.feature_layers),
          steps)
    # the control: the release trained the same steps more on its own kind of text, so that the code column's gain
    # is the new data's and not merely more steps'
    torch.manual_seed(0)
    train(more, batch_of(released, continuations(released, tokenizer, train_prose, 200), more.feature_layers),
          steps)
    out = put_back(tuned, released, release, root, "tuned", kind)
    record = json.loads((out / "draftheads_export.json").read_text())
    if kind == "assistant":   # the whole assistant folder is the drafter: its weights file is what is rewritten
        record["rewritten_files"] = ["model.safetensors"]
        record["bytes_rewritten"] = (out / "model.safetensors").stat().st_size
        record["checkpoint_bytes"] = sum(f.stat().st_size for f in release.iterdir()
                                         if f.is_file() and f.name != "draftheads_export.json")
    rewritten = record["rewritten_files"]
    return {"family": f"{model_type}{' assistant' if kind == 'assistant' else ''}, seed {seed}",
            "shipped code": tau(released, shipped, tokenizer, held_code, depth),
            "tuned code": tau(released, tuned, tokenizer, held_code, depth),
            "more prose, code": tau(released, more, tokenizer, held_code, depth),
            "shipped prose": tau(released, shipped, tokenizer, held_prose, depth),
            "tuned prose": tau(released, tuned, tokenizer, held_prose, depth),
            "rewritten": record["bytes_rewritten"], "size": record["checkpoint_bytes"],
            "files": f"{len(rewritten)}/{len(digests(original))}",
            "original untouched": digests(original) == before}


# transformers' default configs, by class: their sizes are a release's (the target column counts them)
RELEASES = {"DeepseekV3Config (DeepSeek-V3)": DeepseekV3Config, "Glm4MoeConfig (GLM-4.5-Air)": Glm4MoeConfig,
            "Qwen3NextConfig (Qwen3-Next-80B-A3B)": Qwen3NextConfig, "Qwen3_5TextConfig (a dense Qwen3.5)":
            Qwen3_5TextConfig, "Qwen3_5MoeTextConfig (Qwen3.5-35B-A3B)": Qwen3_5MoeTextConfig}
H100_FLOPS = 0.4 * 989e12
ROWS, TOKENS_PER_ROW, STEPS = 10_000, 1024, 3


def active(module, experts_per_token: int, experts: int) -> tuple[int, int]:
    """(parameters, parameters a token runs through): routed experts count experts_per_token / experts."""
    total = routed = 0
    for name, p in module.named_parameters():
        total += p.numel()
        routed += p.numel() if ".experts." in name else 0
    return total, total - routed + routed * experts_per_token // max(1, experts)


def gpu_estimate(name: str, config, gpus: int = 8) -> str:
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(config)
        rows = []
        for train_only in ("all", "fusion"):
            drafter = new_drafter(head_config({"type": "native", "train_only": train_only}), config)
            rows.append(drafter)
    experts = getattr(config, "n_routed_experts", None) or getattr(config, "num_experts", None) or 1
    per_token = getattr(config, "num_experts_per_tok", 1)
    target_total, target_active = active(target, per_token, experts)
    out = []
    for drafter, train_only in zip(rows, ("all", "fusion")):
        total, act = active(drafter, per_token, experts)
        trains = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
        vh = config.vocab_size * config.hidden_size
        per_step = (6 if train_only == "all" else 4) * act + 4 * vh
        flops = ROWS * TOKENS_PER_ROW * (2 * target_active + STEPS * per_step)
        memory = (2 * target_total + 16 * trains + 2 * (total - trains)) / gpus / 2**30
        out.append(f"| {name} | {train_only} | {total / 1e9:.2f}B | {act / 1e9:.2f}B | {trains / 1e9:.3f}B | "
                   f"{target_total / 1e9:.0f}B / {target_active / 1e9:.1f}B | {memory:.0f} GiB | "
                   f"{flops / (H100_FLOPS * gpus) / 60:.0f} |")
    return "\n".join(out)


def print_gpu_estimates() -> None:
    print(f"| release | trains | MTP params | active per token | trained | target params / active | memory per GPU "
          f"(8 GPUs, FSDP) | minutes per {ROWS:,} rows of {TOKENS_PER_ROW} tokens, 8 H100 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, config_class in RELEASES.items():
        print(gpu_estimate(name, config_class()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(SIZES), help="comma-separated model types")
    parser.add_argument("--steps", type=int, default=80, help="AdamW steps to release and again to fine-tune")
    parser.add_argument("--depth", type=int, default=3, help="draft steps (the one shipped module, recursed)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated checkpoint seeds (one row each)")
    parser.add_argument("--gpu-estimate", action="store_true", help="print what a GPU fine-tune of each release needs")
    args = parser.parse_args()
    if args.gpu_estimate:
        print_gpu_estimates()
        return
    print("| family | tau code, shipped | tau code, fine-tuned on code | gain | tau code, the same steps on prose "
          "(control) | tau prose, shipped | tau prose, fine-tuned on code | bytes rewritten / checkpoint | shards "
          "rewritten | original untouched |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model_type in args.families.split(","):
        for seed in (int(x) for x in args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                r = run_family(model_type, Path(tmp), args.steps, args.depth, seed)
            gain = r["tuned code"] / r["shipped code"] - 1
            print(f"| {r['family']} | {r['shipped code']:.2f} | {r['tuned code']:.2f} | {gain:+.1%} | "
                  f"{r['more prose, code']:.2f} | "
                  f"{r['shipped prose']:.2f} | {r['tuned prose']:.2f} | {r['rewritten']:,} / {r['size']:,} "
                  f"({r['rewritten'] / r['size']:.1%}) | {r['files']} | {r['original untouched']} |", flush=True)


if __name__ == "__main__":
    main()
