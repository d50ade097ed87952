"""Rows/s and generated tokens/s of `draftheads data` through llama-server at several concurrencies, and locally.

    python -m benchmarks.datagen_server                               # 48 demo prompts, concurrency 1, 4, 8, local
    python -m benchmarks.datagen_server --prompts 4 --max-new-tokens 32 --concurrency 1,4

The N prompts are the demo recipe's own (self prompts the target writes, once, through the server at the highest
concurrency); every measured run then answers exactly those prompts with the demo recipe's data settings, greedy:
through llama-server serving the embedded target's GGUF (`--gguf` for another file) with as many slots as requests
in flight (`data.backend: openai`, `data.concurrency`), and through the local backend (transformers, the recipe's
dtype and batch size). Timed: run_data alone, not the server's start or the target's load. Nothing else should run
on the machine meanwhile; on a CPU the server and the local backend share the same cores, one after the other.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import datasets

from draftheads.core.targets import embedded_gguf
from draftheads.data.datagen import Processes, make_backend, run_data
from draftheads.data.prompts import collect_prompts
from draftheads.data.target import load_target
from draftheads.interop.llama_cpp_build import install_llama_cpp
from draftheads.interop.llama_server import LlamaServer
from draftheads.recipe import load_recipe

RECIPE = "demo-smollm2"


def recipe_for(out: Path, args, prompts: Path | None = None, url: str | None = None, concurrency: int = 1):
    overrides = [f"data.output={out}", f"data.num_prompts={args.prompts}"]
    if args.max_new_tokens:
        overrides.append(f"data.max_new_tokens={args.max_new_tokens}")
    if prompts is not None:
        overrides.append(f"data.prompts=[{{source: {prompts}}}]")
    if url is not None:
        overrides += ["data.backend=openai", f"data.openai_url={url}/v1", f"data.concurrency={concurrency}"]
    return load_recipe(RECIPE, overrides)


def measured(recipe, target) -> dict:
    start = time.perf_counter()
    out = run_data(recipe, target=target)
    seconds = time.perf_counter() - start
    rows = datasets.load_from_disk(str(out))
    return {"rows": len(rows), "tokens": sum(map(sum, rows["loss_mask"])), "seconds": seconds}


def demo_prompts(work: Path, args, engine, gguf: Path, target) -> Path:
    """The demo recipe's N prompts (self prompts), written once by the target through the server."""
    c = max(args.concurrency)
    with LlamaServer(engine.server, gguf, [], work / "prompts.log", threads=args.threads, slots=c,
                     context=args.context) as server:
        recipe = recipe_for(work / "prompts", args, url=server.url, concurrency=c)
        backend, _ = make_backend(recipe, target, Processes())
        prompts, _ = collect_prompts(recipe.data, write=backend.write, reply=backend.reply)
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps({"turns": p.turns}) + "\n" for p in prompts))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the demo recipe's")
    parser.add_argument("--concurrency", default="1,4,8", help="requests in flight (= server slots), comma-separated")
    parser.add_argument("--gguf", default=None, help="the GGUF llama-server runs (default: the embedded target's)")
    parser.add_argument("--threads", type=int, default=None, help="llama-server's threads (default: every core)")
    parser.add_argument("--context", type=int, default=1024, help="tokens per server slot")
    parser.add_argument("--no-local", action="store_true", help="skip the local backend")
    parser.add_argument("--work", default=None, help="keep the data folders and server logs here (default: removed)")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]

    engine = install_llama_cpp()
    gguf = Path(args.gguf) if args.gguf else embedded_gguf("smollm2-135m")
    base = load_recipe(RECIPE)
    target = load_target(base.target.name, dtype=base.target.dtype, device=base.target.device)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = demo_prompts(work, args, engine, gguf, target)
        for c in args.concurrency:
            with LlamaServer(engine.server, gguf, [], work / f"c{c}.log", threads=args.threads, slots=c,
                             context=args.context) as server:
                results[f"llama-server, concurrency {c}"] = measured(
                    recipe_for(work / f"c{c}", args, prompts, server.url, c), target)
        if not args.no_local:
            results[f"local ({target[0].dtype}, batch {base.data.batch_size})"] = measured(
                recipe_for(work / "local", args, prompts), target)
    tokens = args.max_new_tokens or base.data.max_new_tokens
    print(f"\n{RECIPE}: {args.prompts} prompts, max_new_tokens {tokens}, greedy; server: {gguf.name}")
    print(f"{'backend':<34} {'rows':>5} {'gen tokens':>10} {'seconds':>8} {'rows/s':>7} {'tokens/s':>9}")
    for name, r in results.items():
        print(f"{name:<34} {r['rows']:>5} {r['tokens']:>10} {r['seconds']:>8.1f} {r['rows'] / r['seconds']:>7.2f} "
              f"{r['tokens'] / r['seconds']:>9.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
