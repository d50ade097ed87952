"""The generation loop's state and its one step, for a batch of rows (plain decoding when drafter is None).

State between steps: the target's KV cache holds every committed token of every row except the
newest one, the pending token (already emitted, not yet fed to the target). Each step:

    per row: proposal = drafter.propose(tree)      # a tree rooted at the row's pending token
    logits  = target(all rows' trees | cache, tree masks, positions count + depth)   # one forward
    per row: path, y = acceptance rule(p = warp(logits), q = proposal.q)
             emit the accepted drafts and y (stopping at EOS / max_new_tokens exactly like plain decoding)
    compact the cache to each row's committed slots + path; per row: drafter.observe(features at path, tokens)

Rows are independent: each has its own drafter state (a shallow copy of the drafter that shares its
weights, `copy.copy`), its own generator and its own acceptance. Prompts of different lengths are
left-padded, and rows that accept different numbers of drafts keep different numbers of slots:
`valid` [b, L] marks which cache slots hold a row's committed tokens, and a row's next position is
how many it has. Finished rows leave the batch. With one row this is exactly the single-sequence
loop: no padding, the tree's own mask, the same forwards.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from draftheads.core.drafter import Drafter, Proposal
from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import sample, top1
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.accept import accept, target_warp
from draftheads.decoding.recurrent_state import Replay, has_recurrent_state
from draftheads.decoding.settings import DecodeSettings, eos_ids
from draftheads.decoding.stats import GenerationStats
from draftheads.decoding.verify import compact_cache, new_cache, prefill, verify

ROOT_ONLY = Tree.from_paths([])


def clock(device: torch.device) -> float:
    """Wall time, after the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Row:
    """One sequence of the batch."""

    drafter: Drafter | None
    generator: torch.Generator
    max_new_tokens: int
    generated: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    done: bool = False
    unobserved: list[tuple[int, int]] = field(default_factory=list)   # (fed, following) of plain steps not yet
                                                                       # shown to the drafter


class Decoder:
    """A batch of generations in progress: `start(prompts)`, then `step()` until `done`.

    drafter: shared by every row (row 0 uses it, the others shallow copies with their own state).
    generators: one per row (the rows' sampling and drafting are independent).
    plain_above: while more rows than this are live, steps verify the pending token alone (plain
    decoding): where speculation stops paying. Those steps ask the target for no features and show the drafters
    nothing; when rows finish and speculation resumes, one forward over the positions committed meanwhile gives
    each drafter their features (catch_up), so plain steps cost what plain decoding does.
    """

    def __init__(self, target, drafter: Drafter | None, tree: Tree | DynamicTreeSpec | None, settings: DecodeSettings,
                 generators: list[torch.Generator], max_new_tokens: list[int] | None = None,
                 plain_above: int | None = None):
        self.target, self.drafter, self.settings, self.plain_above = target, drafter, settings, plain_above
        self.eos = eos_ids(target, settings.eos_token_id)
        self.warp = target_warp(settings)   # None: the greedy rule reads the logits' argmax as they are
        self.tree = ROOT_ONLY if drafter is None else tree
        self.feature_layers = tuple(drafter.feature_layers) if drafter is not None else ()
        self.recurrent = has_recurrent_state(target)   # decoding/recurrent_state.py: chains, one row at a time
        budgets = max_new_tokens or [settings.max_new_tokens] * len(generators)
        drafters = ([drafter] + [copy.copy(drafter) for _ in generators[1:]] if drafter is not None
                    else [None] * len(generators))
        self.rows = [Row(d, g, n) for d, g, n in zip(drafters, generators, budgets)]
        self.live: list[int] = []  # rows still generating, in the cache's row order
        self.cache = None
        self.valid: torch.Tensor | None = None  # [live, L] committed slots; None while every slot of every row is
        self.pending: torch.Tensor | None = None  # [live]

    @property
    def done(self) -> bool:
        return not self.live

    # ---- prompts ------------------------------------------------------------------------------

    def start(self, prompts: list[torch.Tensor]) -> None:
        """Prefill the prompts (one [s_i] LongTensor per row) together, emit each row's first token, show the
        drafters their prompts."""
        device = prompts[0].device
        t0 = clock(device)
        ids, mask = left_pad(prompts)
        self.cache = new_cache(self.target)
        out = prefill(self.target, ids, self.cache, self.feature_layers, None if mask.all() else mask)
        firsts = [self._pick(out.logits[r : r + 1, -1], row.generator)
                  for r, row in enumerate(self.rows)]
        self.pending = torch.cat(firsts)
        self.valid = None if mask.all() else mask.bool()
        self.live = list(range(len(self.rows)))
        t1 = clock(device)
        for r, (row, prompt) in enumerate(zip(self.rows, prompts)):
            row.stats.prefill_s += (t1 - t0) / len(self.rows)
            row.stats.prompt_tokens += len(prompt)
            self._emit(row, [int(self.pending[r])])
        for r, (row, prompt) in enumerate(zip(self.rows, prompts)):
            if row.drafter is not None and not row.done:
                t = clock(device)
                row.drafter.reset()
                features = self._features(out.features, r, -len(prompt), None)
                row.drafter.observe(features, torch.cat([prompt[1:], self.pending[r : r + 1]])[None])
                row.stats.draft_prefill_s += clock(device) - t
        self._drop_finished()

    def _pick(self, logits: torch.Tensor, generator) -> torch.Tensor:
        return top1(logits) if self.warp is None else sample(self.warp(logits), generator)

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[list[int]]:
        """One draft + verify round for every live row; returns what each of them emitted (in live order)."""
        device = self.pending.device
        t0 = clock(device)
        plain = self.plain_above is not None and len(self.live) > self.plain_above
        if not plain:
            self._catch_up()
        proposals = [self._propose(r, self.rows[i], plain) for r, i in enumerate(self.live)]
        t1 = clock(device)
        trees = [p.tree for p in proposals]
        width = max(t.num_nodes for t in trees)
        tokens = torch.stack([torch.nn.functional.pad(p.tokens[0], (0, width - p.tokens.shape[1])) for p in proposals])
        shared = len(proposals) == 1 and self.valid is None
        replay = Replay(self.cache) if self.recurrent and width > 1 else None
        out = verify(self.target, self.cache, tokens, trees[0] if shared else trees,
                     () if plain else self.feature_layers, self.valid)
        s = self.settings
        paths, emitted, following = [], [], []
        for r, (i, proposal) in enumerate(zip(self.live, proposals)):
            row, n = self.rows[i], proposal.tree.num_nodes
            result = accept(s.applied_rule, proposal.tree, proposal.tokens, out.logits[r : r + 1, :n], proposal.q,
                            row.generator, epsilon=s.typical_epsilon, delta=s.typical_delta, warp=self.warp)
            path = result.path[0, : int(result.num_accepted[0]) + 1]
            new_tokens = torch.cat([proposal.tokens[0, path[1:]], result.next_token[:1]])
            paths.append(path)
            following.append(new_tokens)
            emitted.append(self._emit(row, new_tokens.tolist()))
            self.pending[r] = result.next_token[0]
        keep = paths[0] if shared else paths
        self.valid = compact_cache(self.cache, width, keep, None if shared else self._committed_slots(width))
        if replay is not None and len(paths[0]) < width:   # one row, a chain: its state absorbed rejected drafts
            replay.restore(self.cache, len(paths[0]))
            verify(self.target, self.cache, tokens[:, paths[0]], Tree.chain(len(paths[0]) - 1))
        t2 = clock(device)
        for r, i in enumerate(self.live):
            row = self.rows[i]
            if row.drafter is not None and not row.done:
                if plain:
                    row.unobserved.append((int(tokens[r, 0]), int(following[r][0])))   # (a copy: pending moved on)
                else:
                    row.drafter.observe(self._features(out.features, r, None, paths[r]), following[r][None])
        t3 = clock(device)
        self._record(trees, paths, emitted, t0, t1, t2, t3)
        self._drop_finished()
        return emitted

    def _catch_up(self) -> None:
        """Show the drafters the positions committed by plain steps: their features from one target forward over
        them (every live row has the same number, one a step), masking their cached copies so each sits at its own
        position again; the extra cache entries are dropped."""
        behind = [self.rows[i] for i in self.live if self.rows[i].unobserved]
        if not behind:
            return
        k = len(behind[0].unobserved)
        fed = torch.tensor([[a for a, _ in self.rows[i].unobserved] for i in self.live], device=self.pending.device)
        features = None
        if self.feature_layers:
            length = self.cache.get_seq_length()
            committed = (self.valid.clone() if self.valid is not None
                         else torch.ones(len(self.live), length, dtype=torch.bool))
            committed[:, length - k :] = False
            chain = Tree.chain(k - 1)
            features = verify(self.target, self.cache, fed, [chain] * len(self.live), self.feature_layers,
                              committed).features
            self.valid = compact_cache(self.cache, k, torch.zeros(0, dtype=torch.long), self.valid)
        for r, i in enumerate(self.live):
            row = self.rows[i]
            following = torch.tensor([[b for _, b in row.unobserved]], device=self.pending.device)
            row.unobserved = []
            row.drafter.observe(self._features(features, r, -k, None), following)

    def _propose(self, r: int, row: Row, plain: bool) -> Proposal:
        pending = self.pending[r : r + 1]
        if plain or row.drafter is None:
            return Proposal(ROOT_ONLY, pending[:, None])
        s = self.settings
        proposal = row.drafter.propose(self.tree, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                       generator=row.generator)
        tokens = proposal.tokens
        if tokens.dim() != 2 or tokens.shape != (1, proposal.tree.num_nodes) or not torch.equal(tokens[:, 0], pending):
            raise RuntimeError(
                f"{type(row.drafter).__name__}.propose returned tokens {tuple(tokens.shape)} for a "
                f"{proposal.tree.num_nodes}-node tree; it must be [1, nodes] with column 0 the pending token"
            )
        if proposal.q is not None:
            check_drawn_without_replacement(type(row.drafter).__name__, proposal.tree, tokens[0].tolist())
        return proposal

    def _committed_slots(self, width: int) -> torch.Tensor:
        """[live, L] which slots before the verified trees hold committed tokens."""
        prefix = self.cache.get_seq_length() - width
        return self.valid if self.valid is not None else torch.ones(len(self.live), prefix, dtype=torch.bool)

    def _record(self, trees, paths, emitted, t0, t1, t2, t3) -> None:
        """Per-row statistics; the step's wall time is shared evenly by the rows it served."""
        share = 1 / len(self.live)
        drafting = self.drafter is not None
        draft_s = ((t1 - t0) + (t3 - t2)) * share if drafting else 0.0  # plain decoding: all of it is the step
        verify_s = (t3 - t0) * share - draft_s
        for i, tree, path, out in zip(self.live, trees, paths, emitted):
            row = self.rows[i]
            context = row.stats.prompt_tokens + len(row.generated) - len(out)
            row.stats.record_step(tree, path.tolist(), len(out), draft_s=draft_s, verify_s=verify_s, context=context)

    def _features(self, features: torch.Tensor | None, r: int, last: int | None,
                  index: torch.Tensor | None) -> torch.Tensor:
        """Row r's features [1, n, F] at its last `last` positions or at `index` (F = 0 when the drafter reads none)."""
        if features is None:
            n = -last if index is None else len(index)
            return torch.empty(1, n, 0, device=self.pending.device)
        row = features[r : r + 1]
        return row[:, last:] if index is None else row[:, index]

    def _emit(self, row: Row, tokens: list[int]) -> list[int]:
        """Append tokens one by one as plain decoding would: stop after an EOS or at max_new_tokens."""
        emitted = []
        for token in tokens:
            emitted.append(token)
            if token in self.eos or len(row.generated) + len(emitted) >= row.max_new_tokens:
                row.done = True
                break
        row.generated += emitted
        return emitted

    def _drop_finished(self) -> None:
        """Rows that have finished leave the batch (and the cache)."""
        keep = [r for r, i in enumerate(self.live) if not self.rows[i].done]
        if len(keep) == len(self.live):
            return
        self.live = [self.live[r] for r in keep]
        if keep:
            index = torch.tensor(keep, device=self.pending.device)
            self.cache.batch_select_indices(index)
            self.pending = self.pending[index]
            self.valid = None if self.valid is None else self.valid[index.cpu()]
            if self.valid is not None and bool(self.valid.all()):
                self.valid = None


def check_drawn_without_replacement(name: str, tree: Tree, tokens: list[int]) -> None:
    """A proposal that passes q says each node's children were drawn from it without replacement, in rank
    order (what the strict rule accounts for); two siblings with the same token contradict that."""
    seen = set()
    for node in range(1, tree.num_nodes):
        key = (tree.parents[node], tokens[node])
        if key in seen:
            raise DraftheadsError(
                f"{name}.propose drew token {tokens[node]} twice among the children of node {key[0]} while passing q; "
                "draw a node's children from q without replacement (draftheads.core.sampling.pick_children), "
                "or return q=None for deterministic children")
        seen.add(key)


def left_pad(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, s] ids (padded on the left with each row's first token) and [b, s] mask (1 for real tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([p[:1].expand(width - len(p)), p]) for p in prompts])
    mask = torch.stack([torch.arange(width, device=p.device) >= width - len(p) for p in prompts]).long()
    return ids, mask
