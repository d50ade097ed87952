"""Prompts for data generation, mixed from the recipe's sources by weight: tables and the bundled sets
(data/prompt_tables.py) or the target itself (data/self_prompts.py).

    prompts, skipped = collect_prompts(recipe.data, write=writer)   # mixed by weight and seed

`skipped` counts rows left out and why.
"""

from __future__ import annotations

import collections
import json
import random
from dataclasses import asdict
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.state_files import DamagedFile, read_json_lines
from draftheads.data.prompt_source import Prompt
from draftheads.data.prompt_tables import EVAL_SETS, humaneval_prompts, load_table_source, task_prompts
from draftheads.data.self_prompts import Writer, fill_quotas, kinds_prompts, normalise, self_prompts
from draftheads.data.standard_sets import is_standard_set, standard_prompts
from draftheads.data.task_kinds import Writers


def load_source(src, skipped: collections.Counter | None = None) -> list[Prompt]:
    """All prompts of one non-'self' source, in source order."""
    skipped = collections.Counter() if skipped is None else skipped
    if src.source == "humaneval":
        return humaneval_prompts(src.limit)
    if src.source in EVAL_SETS:
        return task_prompts(src.limit, src.source)
    if is_standard_set(src.source):
        return standard_prompts(src.source, src.limit)
    return load_table_source(src, skipped)


def collect_prompts(data, write: Writer | None = None, have: list[Prompt] = (),
                    reply=None) -> tuple[list[Prompt], collections.Counter]:
    """data.num_prompts prompts mixed from data.prompts by weight; the order is fixed by data.seed.
    With `have` (the prompts of a folder that grows), only the missing ones, none of them repeating one
    it has; self prompts are then written with new seeds, so the target does not write the same ones again.
    `reply(messages, max_tokens, temperature, seed)`: the target answering user messages, for task kinds with
    passages."""
    skipped: collections.Counter = collections.Counter()
    taken = {tuple(p.turns) for p in have}
    taken_texts = {normalise(turns[0]) for turns in taken}  # what self prompts are compared by
    salt = 7919 * len(have)  # 0 for a first collection: its seeds stay what they always were
    pools = {}
    for i, src in enumerate(data.prompts):
        if src.source in EVAL_SETS or is_standard_set(src.source):
            # an evaluation set trained on would make its figures meaningless (the standard names are test splits)
            raise DraftheadsError(f"data.prompts: '{src.source}' is an evaluation set and is never trained on; "
                                  "use 'self', 'humaneval', a hub dataset's train split or a local file")
        if src.source != "self":
            pool = load_source(src, skipped)
            random.Random(f"{data.seed}:{i}").shuffle(pool)
            pools[i] = [p for p in pool if tuple(p.turns) not in taken]
    available = [len(pools[i]) if i in pools else float("inf") for i in range(len(data.prompts))]
    take = fill_quotas([s.weight for s in data.prompts], available, max(data.num_prompts - len(have), 0))
    chosen = []
    for i, (src, n) in enumerate(zip(data.prompts, take)):
        if n == 0:
            continue
        if src.source == "self":
            if write is None:
                raise DraftheadsError("'self' prompts need the target to write them; they cannot be made here")
            if src.kinds is not None:
                chosen += kinds_prompts(Writers(write, reply), n, src, data.seed + i + salt, skipped, seen=taken_texts)
            else:
                chosen += self_prompts(write, n, src, data.seed + i + salt, skipped, seen=taken_texts)
        else:
            chosen += pools[i][:n]
    random.Random(f"{data.seed}:{len(have)}" if have else data.seed).shuffle(chosen)
    return chosen, skipped


def save_prompts(path: Path, prompts: list[Prompt]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in prompts))
    tmp.replace(path)  # atomic: a reader sees all prompts or none


def read_prompts(path: Path) -> list[Prompt]:
    """A data folder's prompts.jsonl, as save_prompts wrote it."""
    what, fix = "prompt list", "regenerate the folder with `draftheads data RECIPE --overwrite`"
    records = read_json_lines(path, what, fix)
    try:
        return [Prompt(**record) for record in records]
    except TypeError as e:   # fields Prompt does not have, or lacks
        raise DamagedFile(path, what, str(e), fix) from None
