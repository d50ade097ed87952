"""Tokens/s of our data generation next to a bare batched `model.generate`, same prompts, same run.

    python benchmarks/data_throughput.py                       # embedded SmolLM2-135M, 96 HumanEval prompts
    python benchmarks/data_throughput.py --target PATH --prompts 48 --batch-size 16 --max-new-tokens 64

Both sides answer the same length-sorted batches greedily, stopping at the same stop tokens;
batches alternate between the two so that load from other processes hits both alike. Counted
tokens are the useful ones: each row's tokens up to and including its first stop token.
Goal: ours >= 0.8x of model.generate.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftheads.data.batch_generate import generate_batch, left_pad, length_sorted_batches
from draftheads.data.chat import render_ids, stop_token_ids
from draftheads.data.prompt_tables import humaneval_prompts
from draftheads.data.target import load_target


def useful(tokens: list[int], stops: set[int]) -> list[int]:
    """Tokens up to and including the first stop token."""
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens


def ours(model, batch, args, stops, pad) -> list[list[int]]:
    outs = generate_batch(model, batch, max_new_tokens=args.max_new_tokens, stop_ids=stops, pad_id=pad)
    return [o.tokens for o in outs]


@torch.inference_mode()
def bare_generate(model, batch, args, stops, pad) -> list[list[int]]:
    ids, mask = left_pad(batch, pad, model.device)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False,
                         eos_token_id=sorted(stops), pad_token_id=pad)
    return [useful(row, stops) for row in out[:, ids.shape[1]:].tolist()]


def timed(fn, *a) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    result = fn(*a)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    model, tok = load_target(args.target, dtype=args.dtype, device=args.device)
    stops = stop_token_ids(tok, model.generation_config)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    prompts = [render_ids(tok, [{"role": "user", "content": p.turns[0]}], True)
               for p in humaneval_prompts(args.prompts)]
    batches = [[prompts[i] for i in b] for b in length_sorted_batches([len(p) for p in prompts], args.batch_size)]
    print(f"{args.target} ({model.dtype}, {model.device}, {torch.get_num_threads()} threads): {len(prompts)} prompts, "
          f"batch {args.batch_size}, max_new_tokens {args.max_new_tokens}")
    for fn in (ours, bare_generate):  # warm-up: first calls pay for allocation and kernel selection
        fn(model, batches[-1][:2], argparse.Namespace(max_new_tokens=4), set(stops), pad)

    totals = {"ours": [0, 0.0], "generate": [0, 0.0]}
    same = 0
    for batch in batches:
        a, ta = timed(ours, model, batch, args, set(stops), pad)
        b, tb = timed(bare_generate, model, batch, args, set(stops), pad)
        totals["ours"][0] += sum(map(len, a))
        totals["ours"][1] += ta
        totals["generate"][0] += sum(map(len, b))
        totals["generate"][1] += tb
        same += sum(x == y for x, y in zip(a, b))
        print(f"  batch of {len(batch)}: ours {sum(map(len, a))} tokens in {ta:.1f} s, "
              f"generate {sum(map(len, b))} tokens in {tb:.1f} s", flush=True)
    rate = {k: n / s for k, (n, s) in totals.items()}
    for k, (n, s) in totals.items():
        print(f"  {k:>9}: {n} tokens in {s:.1f} s = {rate[k]:.1f} tokens/s")
    print(f"  ratio ours / generate: {rate['ours'] / rate['generate']:.2f}x (goal >= 0.8x); "
          f"identical responses: {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
