"""How draftheads/data/prompt_sets/long.jsonl was made: the bundled long-context evaluation set (`--prompts long`).

    python tools/long_prompts.py [--per-kind 6] [--out draftheads/data/prompt_sets/long.jsonl]

The embedded target writes the articles and questions of the four passage kinds (data/task_kinds.py) with a seed
no recipe uses (SEED), as self-written training data would be made, but the rows are stored and never trained on
(data.prompts refuses 'long'). Retrieval prompts hold four articles (1,400-1,830 tokens as written on 2026-12-02);
the others one (120-650); a kind whose articles the filters reject gets fewer rows (22 then: 6, 6, 5, 5), written
in 10.5 min on 2 cores.
The rows cycle through the kinds, so the first 4 n prompts hold n of each kind.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

SEED = 7_700_001
KINDS = ("summarization", "extraction", "qa", "retrieval")


def main() -> None:
    import draftheads
    from draftheads.data.batch_generate import LocalBackend
    from draftheads.data.datagen import DataConfig
    from draftheads.data.prompt_source import PromptSource
    from draftheads.data.self_prompts import kinds_prompts
    from draftheads.data.task_kinds import Writers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=6)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "draftheads" / "data" / "prompt_sets"
                                             / "long.jsonl"))
    args = parser.parse_args()
    model, tokenizer = draftheads.load_target("smollm2-135m", dtype="bf16")
    src = PromptSource(source="self", kinds={k: 1 for k in KINDS}, temperature=0.7, max_tokens=96, passage_tokens=640)
    backend = LocalBackend(model, tokenizer, DataConfig(batch_size=16))
    skipped = collections.Counter()
    prompts = kinds_prompts(Writers(backend.write, backend.reply), args.per_kind * len(KINDS) + 4, src, SEED, skipped)
    by_kind = {k: [p for p in prompts if p.kind == k][: args.per_kind] for k in KINDS}
    rows = [{"kind": k, "turns": by_kind[k][i].turns} for i in range(args.per_kind) for k in KINDS
            if i < len(by_kind[k])]
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = {k: [len(tokenizer(p.turns[0]).input_ids) for p in by_kind[k]] for k in KINDS}
    print(f"{len(rows)} prompts -> {args.out}; tokens per kind (min-max): "
          + ", ".join(f"{k} {min(v)}-{max(v)}" for k, v in lengths.items() if v) + f"; skipped {dict(skipped)}")


if __name__ == "__main__":
    main()
