"""Every target family people serve x every drafter kind (tests/families.py builds the targets from transformers'
own classes).

For each cell: the target writes rows, the drafter trains 2 steps on them, and then drafts exactly: greedy output
equal to plain decoding in fp32, for a chain and a tree, one row and two. Every engine export of the trained drafter
is either written and read back to the same output, or refused in one line that names the engine. One drafter per
family (a different kind on each) also passes a strict-sampling chi-square. Hybrid targets (Qwen3-Next, Qwen3.5)
verify chains of one row; trees and batches are refused in one line (decoding/recurrent_state.py).

The fast part runs one kind per family, rotating so every kind meets several families, and one family through the
real training loop; the rest of the matrix is marked slow. With DRAFTHEADS_MATRIX=FILE each cell appends its
outcomes to FILE (the table of the closing note).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from draftheads.api import build_drafter, load_drafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import warp_probs
from draftheads.core.tree import Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter
from tests.decoding.test_strict import chi2_pvalue
from tests.families import FAMILIES, HYBRID, family_target
from tests.fixtures import make_tokenizer
from tests.heads.batches import target_features

KINDS = {
    "medusa": {"num_heads": 2},
    "medusa2": {"num_heads": 2},
    "eagle": {},
    "eagle3": {"draft_vocab_size": 128},
    "mtp": {"depth": 2},
    "dflash": {"block_size": 4},
    "peagle": {"depths": 3, "draft_vocab_size": 128},
    "dspark": {"block_size": 3, "markov_rank": 8},
}
CHAIN = Tree.chain(2)
TREE = Tree.from_paths([(0,), (1,), (0, 0), (1, 0)])
# llama.cpp needs a GGUF target: tests/engines
FORMATS = ("vllm", "sglang", "tgi", "speculators", "deepseek-mtp", "deepspec")
NEW_TOKENS = 12
P_MIN = 1e-4   # per-family chi-square threshold, as tests/decoding/test_strict.py


def rotation(family: str) -> str:
    """The kind the fast part runs on `family`: each kind meets two or three of the 18 families."""
    return list(KINDS)[FAMILIES.index(family) % len(KINDS)]


FAST_STRICT = ("gemma3_text",)   # the strict check of one family in the fast part: local and global rotaries
CELLS = [pytest.param(f, k, id=f"{f}-{k}", marks=() if k == rotation(f) else pytest.mark.slow)
         for f in FAMILIES for k in KINDS]


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def prompts(tokenizer) -> list[torch.Tensor]:
    """Two prompts of different lengths (a batch of two is left-padded)."""
    return [torch.tensor(tokenizer(text)["input_ids"]) for text in ("def add(a, b):", "The quick brown fox jumps")]


def target_rows(target, tokenizer) -> dict:
    """Two rows the target wrote: a prompt (not counted) and its greedy continuation (counted), with features."""
    ids = [torch.cat([p, speculative_generate(target, None, p, 16, eos_token_id=[]).tokens[0]])
           for p in prompts(tokenizer)]
    width = max(len(r) for r in ids)
    input_ids = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in ids])
    attention = torch.stack([torch.arange(width) < len(r) for r in ids]).long()
    loss_mask = attention.clone()
    for row, p in enumerate(prompts(tokenizer)):
        loss_mask[row, : len(p)] = 0
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


def trained(family: str, kind: str, tokenizer):
    """(target, drafter): a fresh target (Medusa-2 adapts it) and the drafter after 2 AdamW steps on its rows."""
    target = family_target(family, tokenizer)
    batch = target_rows(target, tokenizer)
    torch.manual_seed(0)
    drafter = build_drafter(kind, target, **KINDS[kind])
    if KINDS[kind].get("draft_vocab_size"):
        counted = batch["input_ids"][batch["loss_mask"].bool()]
        drafter.set_draft_vocab(torch.bincount(counted, minlength=target.config.vocab_size))
    if drafter.feature_layers:
        batch["features"] = target_features(target, batch["input_ids"], batch["attention_mask"],
                                            drafter.feature_layers)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-3)
    drafter.train()
    for _ in range(2):
        loss, _ = drafter.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return target, drafter.eval()


def decode_outcomes(family: str, target, drafter, tokenizer) -> dict:
    """(tree, rows) -> 'pass', or 'refused: <line>' where the target cannot verify it (hybrids)."""
    out = {}
    for name, tree in (("chain", CHAIN), ("tree", TREE)):
        for rows in (1, 2):
            batch = prompts(tokenizer)[:rows]
            try:
                spec = speculative_generate(target, drafter, batch, NEW_TOKENS, tree=tree, eos_token_id=[])
            except DraftheadsError as e:
                assert family in HYBRID, f"{name}, {rows} rows: {e}"
                out[f"{name}/{rows}"] = f"refused: {e}"
                continue
            plain = speculative_generate(target, None, batch, NEW_TOKENS, eos_token_id=[])
            assert spec.rows == plain.rows, f"{family} {type(drafter).__name__} {name} {rows} rows"
            out[f"{name}/{rows}"] = "pass"
    assert out["chain/1"] == "pass"
    return out


def export_outcomes(target, drafter, folder, tokenizer) -> dict:
    """format -> 'written' (and read back: the same greedy output) or 'refused: <line naming the engine>'."""
    target.save_pretrained(folder / "target")
    tokenizer.save_pretrained(folder / "target")
    target.name_or_path = str(folder / "target")
    native = save_drafter(drafter, folder / "native", target=target)
    plain = speculative_generate(target, None, prompts(tokenizer)[0], NEW_TOKENS, eos_token_id=[]).tokens
    out = {}
    for fmt in FORMATS:
        try:
            exported = export_drafter(str(native), fmt, str(folder / fmt), target=str(folder / "target"))
        except DraftheadsError as e:
            assert fmt.split("-")[0] in str(e).lower(), f"{fmt}: the refusal does not name the engine: {e}"
            out[fmt] = f"refused: {e}"
            continue
        again = load_drafter(str(exported), target)
        tokens = speculative_generate(target, again, prompts(tokenizer)[0], NEW_TOKENS, tree=CHAIN,
                                      eos_token_id=[]).tokens
        assert tokens.tolist() == plain.tolist(), f"{fmt} export read back drafts differently"
        out[fmt] = "written"
    return out


def record(family: str, kind: str, outcomes: dict) -> None:
    path = os.environ.get("DRAFTHEADS_MATRIX")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"family": family, "kind": kind, **outcomes}) + "\n")


@pytest.mark.parametrize("family,kind", CELLS)
def test_each_kind_trains_drafts_exactly_and_exports_on_each_family(family, kind, tokenizer, tmp_path):
    target, drafter = trained(family, kind, tokenizer)
    outcomes = decode_outcomes(family, target, drafter, tokenizer)
    outcomes.update(export_outcomes(target, drafter, tmp_path, tokenizer))
    record(family, kind, outcomes)


@torch.no_grad()
def three_token_law(model, prompt: torch.Tensor, **warp) -> dict[tuple[int, int, int], float]:
    """The exact P(y1, y2, y3) of plain sampling after `prompt` [s], over the triples it can emit."""
    def next_law(ids):
        return warp_probs(model(input_ids=ids[None]).logits[0, -1], **warp).double()

    law = {}
    first = next_law(prompt)
    for y1 in first.nonzero()[:, 0].tolist():
        second = next_law(torch.cat([prompt, torch.tensor([y1])]))
        for y2 in second.nonzero()[:, 0].tolist():
            third = next_law(torch.cat([prompt, torch.tensor([y1, y2])]))
            for y3 in third.nonzero()[:, 0].tolist():
                law[y1, y2, y3] = float(first[y1] * second[y2] * third[y3])
    return law


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in FAST_STRICT else pytest.mark.slow)
                                    for f in FAMILIES])
def test_strict_sampling_keeps_the_target_distribution_on_each_family(family, tokenizer):
    """Strict acceptance with a barely trained drafter (a different kind per family) emits (y1, y2, y3) with plain
    sampling's joint law, T 0.8, top-k 3, top-p 0.95: y2 and y3 come from drafted, verified steps, and y3 from the
    second step whenever the first did not accept its whole chain (on a hybrid target: after its state was rebuilt).
    600 runs over at most 27 triples: about 22 expected per cell."""
    target, drafter = trained(family, rotation(family), tokenizer)
    rows = 1 if family in HYBRID else 200   # a recurrent target decodes one row at a time
    assert strict_pvalue(target, drafter, prompts(tokenizer)[0], rows) > P_MIN


def strict_pvalue(target, drafter, prompt: torch.Tensor, rows: int, tree: Tree = CHAIN) -> float:
    """The chi-square p-value of (y1, y2, y3) from 600 strict-acceptance runs (T 0.8, top-k 3, top-p 0.95, `rows`
    at a time) against plain sampling's exact law after `prompt`; a last cell counts triples outside it."""
    warp = dict(temperature=0.8, top_k=3, top_p=0.95)
    seen = []
    for start in range(0, 600, rows):
        out = speculative_generate(target, drafter, [prompt] * rows, 3, seed=list(range(start, start + rows)),
                                   accept="strict", tree=tree, eos_token_id=[], **warp)
        seen += [tuple(t) for t in out.tokens.tolist()]
    law = three_token_law(target, prompt, **warp)
    cells = list(law)
    counts = torch.tensor([seen.count(c) for c in cells] + [sum(t not in law for t in seen)], dtype=torch.float64)
    probs = torch.tensor([law[c] for c in cells] + [0.0], dtype=torch.float64)
    return chi2_pvalue(counts, probs)
