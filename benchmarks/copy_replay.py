"""tau of the model-free drafters (prompt lookup, suffix decoding at several settings) replayed on text the target
wrote: what their defaults were chosen from.

    python -m benchmarks.copy_replay [--prompts humaneval tasks long] [--limit 40] [--texts runs/bench/texts]

The embedded target answers each prompt once, greedily (cached as JSON under --texts); then each drafter is walked
along those answers in order, as the loop would run it on them: it proposes from the text so far, the longest
proposed path that the answer continues is accepted, the next token follows, and the output cache carries from
one answer to the next. Greedy decoding with a drafter emits exactly these answers in fp32 (in bf16 a verify can
round a near-tie the other way, so a measured run parts from them now and then), so tau here is tau there without
running the target per drafter. Nodes per step are what a verify would cost; `draftheads eval` measures speedup.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

SETTINGS = [   # (spec_factor, min_prob, max_nodes, max_cached_tokens)
    (1.0, 0.1, 16, 8192), (1.0, 0.1, 16, 0), (2.0, 0.1, 16, 8192), (4.0, 0.1, 16, 8192), (8.0, 0.1, 16, 8192),
    (2.0, 0.0, 16, 8192), (4.0, 0.1, 8, 8192), (100.0, 0.1, 16, 8192),
]


def answers(source: str, limit: int, folder: Path) -> list[dict]:
    """[{prompt, reply}] for the prompt set's first `limit` prompts, from the cache or the target."""
    import draftheads
    from draftheads.data.chat import stop_token_ids
    from draftheads.data.prompt_source import PromptSource
    from draftheads.data.prompts import load_source
    from draftheads.decoding.generate import speculative_generate
    from draftheads.decoding.settings import DecodeSettings
    from draftheads.measurement.conversations import Conversation, EvalSettings, first_chat

    path = folder / f"{source}-{limit}.json"
    if path.is_file():
        return json.loads(path.read_text())
    model, tokenizer = draftheads.load_target("smollm2-135m", dtype="bf16")
    stops = stop_token_ids(tokenizer)
    settings = EvalSettings(DecodeSettings(max_new_tokens=128, eos_token_id=stops), max_length=8192)
    rows = []
    for i, prompt in enumerate(load_source(PromptSource(source=source, limit=limit), collections.Counter())):
        ids = first_chat(tokenizer, Conversation(i, prompt.turns[:1], prompt.system), settings).input_ids
        reply = speculative_generate(model, None, torch.tensor(ids), 128, eos_token_id=stops).rows[0]
        rows.append({"prompt": ids, "reply": reply})
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    return rows


def accepted(paths: list[tuple[int, ...]], tokens: list[int], truth: list[int]) -> int:
    """How deep the proposed tree follows `truth`."""
    by_path, path = dict(zip(paths, tokens)), ()
    while len(path) < len(truth):
        child = next((p for p, t in by_path.items() if p[:-1] == path and len(p) == len(path) + 1
                      and t == truth[len(path)]), None)
        if child is None:
            break
        path = child
    return len(path)


def replay(drafter, rows: list[dict], tree) -> tuple[float, float]:
    """(tau, nodes per step) of `drafter` walked along every reply in turn."""
    steps = tokens = nodes = 0
    for row in rows:
        reply = row["reply"]
        drafter.reset()
        first = row["prompt"][1:] + reply[:1]   # what the loop shows a drafter after the prefill
        drafter.observe(torch.empty(1, len(first), 0), torch.tensor([first]))
        done = 1
        while done < len(reply):
            proposal = drafter.propose(tree)
            depth = accepted(list(proposal.tree.paths), proposal.tokens[0, 1:].tolist(), reply[done:])
            new = reply[done : done + depth + 1]
            drafter.observe(torch.empty(1, len(new), 0), torch.tensor([new]))
            done, steps, tokens, nodes = done + len(new), steps + 1, tokens + len(new), nodes + proposal.tree.num_nodes
    return tokens / steps, nodes / steps


def main() -> None:
    from draftheads.core.tree import Tree
    from draftheads.decoding.lookup import PromptLookupDrafter
    from draftheads.decoding.suffix import SuffixDrafter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", nargs="+", default=["humaneval", "tasks", "long"])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--texts", default="runs/bench/texts")
    args = parser.parse_args()
    for source in args.prompts:
        rows = answers(source, args.limit, Path(args.texts))
        print(f"{source}: {len(rows)} answers")
        tau, nodes = replay(PromptLookupDrafter(), rows, Tree.chain(6))
        print(f"  prompt lookup chain:6                         tau {tau:.2f}  nodes/step {nodes:.2f}")
        for factor, min_prob, max_nodes, cached in SETTINGS:
            drafter = SuffixDrafter(spec_factor=factor, min_prob=min_prob, max_nodes=max_nodes,
                                    max_cached_tokens=cached)
            tau, nodes = replay(drafter, rows, drafter.default_tree)
            print(f"  suffix factor {factor:<5g} min_prob {min_prob:<4g} nodes {max_nodes:<3d} cache {cached:<5d} "
                  f"tau {tau:.2f}  nodes/step {nodes:.2f}")


if __name__ == "__main__":
    main()
