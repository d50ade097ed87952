"""What a speculative step costs inside llama.cpp on this machine, and the tokens per pass a drafter needs to pay.

    python -m benchmarks.llama_cpp_costs EXPORT_FOLDER [--types Q4_1,Q4_0] [--draft-tokens 1,2,3,4] [--prompts 5]

EXPORT_FOLDER is a `draftheads export --format llama.cpp` folder (drafter.gguf and the target GGUF). For the target
as shipped and requantized to each of --types (from its own weights, with the gguf package: the values it holds
are re-rounded, nothing is added), with llama-server:
- a decode step: the mean time per token of plain greedy decoding (128 tokens, the first HumanEval prompts);
- verifying k tokens: the time of one forward over k new tokens on a cached 150-token prompt (median of 7), as a
  multiple of a decode step: what a speculative pass with k-1 drafts pays for its verification alone;
- the drafter (draft-eagle3, chain of n): its tokens per target pass and time per pass on the same prompts, and
  what drafting adds to a pass beyond the verification;
then the speedup the pass costs allow: tokens per pass / pass cost, and the tokens per pass a 1.5x speedup needs.
Everything is timed by the engine itself; nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import urllib.request
from pathlib import Path

import numpy as np


def requantize(src: Path, dst: Path, kind: str) -> Path:
    """The GGUF at `src` with every 2-D quantized or float matrix requantized to `kind` (Q4_0, Q8_0, ...)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFWriter
    from gguf.quants import dequantize, quantize

    from draftheads.interop.llama_cpp import copy_fields

    to = getattr(Q, kind)
    reader = GGUFReader(str(src))
    writer = GGUFWriter(str(dst), arch=reader.fields["general.architecture"].contents())
    # the writer adds the GGUF.* header fields and the architecture itself
    copy_fields(reader, writer, lambda name: not name.startswith("GGUF.") and name != "general.architecture")
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape.tolist())]
        data = np.array(t.data)
        if len(shape) == 2 and t.tensor_type not in (Q.I64, Q.I32):
            data = quantize(dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32), to)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=to)
        else:
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def synthetic_target(shipped: Path, dst: Path, hidden: int, layers: int, ffn: int, kind: str = "Q4_0") -> Path:
    """A Llama of the given sizes with random weights in `kind`, the shipped target's tokenizer and vocabulary: what a
    decode step and a verification of k tokens cost on a bigger model (its outputs mean nothing)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFWriter
    from gguf.quants import quantize

    from draftheads.interop.llama_cpp import copy_tokenizer

    reader = GGUFReader(str(shipped))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    heads, kv_heads = hidden // 64, max(1, hidden // 256)
    writer = GGUFWriter(str(dst), arch="llama")
    for key, value in {"block_count": layers, "context_length": 8192, "embedding_length": hidden,
                       "feed_forward_length": ffn, "attention.head_count": heads, "attention.head_count_kv": kv_heads,
                       "rope.dimension_count": 64}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    copy_tokenizer(reader, writer)
    rng, to = np.random.default_rng(0), getattr(Q, kind)

    def matrix(name: str, rows: int, cols: int) -> None:
        data = quantize((rng.standard_normal((rows, cols), dtype=np.float32) * 0.02), to)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=to)

    matrix("token_embd.weight", vocab, hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for part, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv_heads * 64, hidden),
                                 ("attn_v", kv_heads * 64, hidden), ("attn_output", hidden, hidden),
                                 ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn)):
            matrix(f"blk.{i}.{part}.weight", rows, cols)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def post(server, ids: list[int], n: int, cache: bool) -> dict:
    body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "cache_prompt": cache, "return_tokens": True}
    request = urllib.request.Request(server.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def verify_costs(server, prefix: list[int], ks: list[int]) -> dict[int, float]:
    """k -> ms of one forward over k new tokens after the cached `prefix` (median of 7)."""
    out = {}
    post(server, prefix, 1, True)
    for k in ks:
        times = []
        for rep in range(7):
            post(server, prefix, 1, True)   # back to the prefix alone
            extra = [1000 + (rep * 37 + j * 11) % 30000 for j in range(k)]
            times.append(post(server, prefix + extra, 1, True)["timings"]["prompt_ms"])
        out[k] = statistics.median(times)
    return out


def main() -> None:
    from transformers import AutoTokenizer

    from draftheads.data.prompt_tables import humaneval_prompts
    from draftheads.interop.llama_cpp_build import install_llama_cpp
    from draftheads.interop.llama_server import LlamaServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="a draftheads export --format llama.cpp folder")
    parser.add_argument("--types", default="Q4_1,Q4_0",
                        help="target quantizations: the shipped one first, then requantized")
    parser.add_argument("--draft-tokens", default="1,2,3,4")
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--flash-attn", action="store_true", help="run llama-server with -fa on")
    parser.add_argument("--synthetic", default=None, metavar="HIDDEN,LAYERS,FFN",
                        help="also time a decode step and verifications on a random-weight Llama of these sizes (Q4_0)")
    args = parser.parse_args()
    folder = Path(args.export)
    record = json.loads((folder / "draftheads_export.json").read_text())
    shipped, drafter = folder / record["llama_cpp"]["target"], folder / "drafter.gguf"
    tokenizer = AutoTokenizer.from_pretrained(record["llama_cpp"].get("tokenizer") or _embedded())
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}], add_generation_prompt=True,
                                             tokenize=True)
               for p in humaneval_prompts(args.prompts)]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    engine = install_llama_cpp()
    extra = ["-fa", "on"] if args.flash_attn else []
    ns = [int(n) for n in args.draft_tokens.split(",")]
    work = Path("runs/bench/llama_cpp_costs")
    work.mkdir(parents=True, exist_ok=True)
    print("| target | decode step | verify k=2 / 3 / 4 / 5 (decode steps) | drafter | tokens/pass | pass (steps) | "
          "of which drafting | speedup | tokens/pass for 1.5x |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, kind in enumerate(args.types.split(",")):
        target = shipped if i == 0 else requantize(shipped, work / f"target-{kind}.gguf", kind)
        with LlamaServer(engine.server, target, extra, work / "plain.log", context=4096) as server:
            plain = [post(server, p, 128, False) for p in prompts]
            step = sum(r["timings"]["predicted_ms"] for r in plain) / sum(r["timings"]["predicted_n"] for r in plain)
            costs = verify_costs(server, prompts[0][:150], [1, 2, 3, 4, 5, 6])
        rows = []
        with contextlib.ExitStack() as stack:
            for n in ns:
                server = stack.enter_context(LlamaServer(engine.server, target,
                                                         extra + ["-md", str(drafter), "--spec-type", "draft-eagle3",
                                                                  "--spec-draft-n-max", str(n)],
                                                         work / f"n{n}.log", context=4096))
                answers = [post(server, p, 128, False) for p in prompts]
                tokens = sum(a["timings"]["predicted_n"] for a in answers)
                accepted = sum(a["timings"].get("draft_n_accepted", 0) for a in answers)
                passes = tokens - len(answers) - accepted
                per_pass = sum(a["timings"]["predicted_ms"] for a in answers) / max(1, passes)
                tau = (tokens - len(answers)) / max(1, passes)
                drafting = per_pass - costs[n + 1]
                rows.append((n, tau, per_pass / step, drafting / step, tau / (per_pass / step), 1.5 * per_pass / step))
        verify = " / ".join(f"{costs[k] / step:.2f}" for k in (2, 3, 4, 5))
        for n, tau, pass_steps, draft_steps, speedup, needed in rows:
            print(f"| {kind}{' (shipped)' if i == 0 else ''} | {step:.2f} ms | {verify} | n={n} | {tau:.2f} | "
                  f"{pass_steps:.2f} | {draft_steps:.2f} | {speedup:.2f}x | {needed:.2f} (at most {n + 1}) |",
                  flush=True)
    if args.synthetic:
        hidden, layers, ffn = (int(x) for x in args.synthetic.split(","))
        target = synthetic_target(shipped, work / f"synthetic-{hidden}x{layers}.gguf", hidden, layers, ffn)
        with LlamaServer(engine.server, target, extra, work / "synthetic.log", context=4096) as server:
            plain = [post(server, p, 64, False) for p in prompts[:2]]
            step = sum(r["timings"]["predicted_ms"] for r in plain) / sum(r["timings"]["predicted_n"] for r in plain)
            costs = verify_costs(server, prompts[0][:150], [1, 2, 3, 4, 5, 6])
        size = target.stat().st_size / 2 ** 30
        print(f"\nrandom Llama {hidden}x{layers} (FFN {ffn}, Q4_0, {size:.2f} GiB): decode step {step:.2f} ms; "
              "verifying k = " + ", ".join(f"{k}: {costs[k] / step:.2f}" for k in (2, 3, 4, 5, 6)) + " decode steps")


def _embedded() -> str:
    from draftheads.core.targets import embedded_checkpoint

    return str(embedded_checkpoint("smollm2-135m"))


if __name__ == "__main__":
    main()
