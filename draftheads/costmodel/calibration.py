"""What an evaluation fits on the calibration prompts before its measured runs: a static tree for each learned
drafter (`--tree auto`), the costs a gated combination weighs (decoding/gate.py) and a confidence-scheduled drafter
weighs (heads/parts/dspark_drafting.py), and each drafter's cost profile on this machine (costmodel/profile.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import AutoTreeSpec, Tree
from draftheads.costmodel.auto_tree import auto_tree, expected_accepted
from draftheads.costmodel.cost_model import fastest_tree
from draftheads.costmodel.profile import drafter_profile, folder_fingerprint
from draftheads.decoding.gate import GateCosts, LearnedGate, gate_costs, measured_costs
from draftheads.decoding.stats import GenerationStats
from draftheads.heads.parts.dspark_drafting import VerifyCosts
from draftheads.measurement.conversations import Conversation, EvalSettings, first_chat
from draftheads.measurement.entries import Entry, copier_entry, describe_tree, learned_source
from draftheads.measurement.measure import RunConfig, generate_conversations

# The comb tree that measures acceptance by depth and rank: COMB_WIDTH candidates at each of COMB_DEPTH depths.
COMB_WIDTH, COMB_DEPTH = 8, 6


@dataclass
class Calibration:
    """What an evaluation fits on before its measured runs: the target, the calibration prompts decoded with the
    evaluation's settings, the machine's cost profile (costmodel/profile.py) and the evaluated prompts' lengths in
    tokens (the contexts the costs are predicted at)."""

    model: object
    tokenizer: object
    conversations: list[Conversation]
    settings: EvalSettings
    profile: object = None
    lengths: list[int] = field(default_factory=list)

    def runs(self, entry: Entry | None, cfg: RunConfig, conversations: list[Conversation] | None = None,
             max_new_tokens: int | None = None):
        """`entry` (None: plain decoding) answering the calibration prompts (or `conversations`) under `cfg`, one
        batch: measure.generate_conversations."""
        return generate_conversations(self.model, self.tokenizer, self.conversations if conversations is None
                                      else conversations, entry, cfg, self.settings, max_new_tokens=max_new_tokens)


def profile_entry(cal: Calibration, entry: Entry):
    """The drafter's cached cost profile (draft time per level and per node), timed on the first calibration prompt."""
    model = cal.model
    prompt = torch.tensor(first_chat(cal.tokenizer, cal.conversations[0], cal.settings).input_ids, device=model.device)
    folder = entry.info.get("folder")
    key = {"drafter": entry.name, "kind": entry.kind, "folder": folder_fingerprint(Path(folder)) if folder else None,
           "lookup_depth": entry.drafter.lookup_depth if entry.kind == "combined" else None,
           "copier": entry.info.get("copier")}
    return drafter_profile(model, entry.drafter, prompt=prompt, name=entry.name, key=key, draft_limit=entry.draft_limit,
                           progress=lambda line: print(line, flush=True))


def comb_tree(width: int, depth: int) -> Tree:
    """`width` candidates at every depth below the rank-0 path: measures P(rank r accepted | depth reached)."""
    return Tree.from_paths([(0,) * d + (r,) for d in range(depth) for r in range(width)])


def fit_auto_trees(cal: Calibration, entries: list[Entry], spec: AutoTreeSpec) -> None:
    """Give each learned drafter a static tree of at most `spec.budget` nodes fitted to its per-depth, per-rank
    accuracies, measured with greedy decoding on the calibration prompts (Medusa's recipe): the one with the
    highest predicted tokens/s on this machine (objective 'speed'), or the one with the most expected tokens per
    forward (objective 'tau'). Combined drafters take their learned drafter's tree; prompt lookup keeps its chain."""
    budget = spec.budget
    for entry in entries:
        if entry.kind != "learned":
            continue
        # Medusa and MTP cannot draft deeper than their heads / modules
        comb = comb_tree(COMB_WIDTH, min(COMB_DEPTH, entry.draft_limit or COMB_DEPTH))
        probe = Entry(entry.name, entry.kind, entry.drafter, comb, comb.depth)
        runs = [cal.runs(probe, RunConfig("greedy", 0.0), [c])[0] for c in cal.conversations]
        table = [row + [0.0] * (COMB_WIDTH - len(row))
                 for row in GenerationStats.merged(r.stats for r in runs).rank_accuracy]
        try:
            if spec.objective == "speed":
                costs = profile_entry(cal, entry)
                tree, figures = fastest_tree(cal.profile, costs, table or [[0.0]], cal.lengths,
                                             cal.settings.decode.max_new_tokens, max_budget=budget)
                note = (f"auto:{budget} -> {tree.num_nodes - 1} nodes (predicted {figures['tau']:.2f} tokens/forward, "
                        f"{figures['speedup']:.2f}x)")
            else:
                tree = auto_tree(table or [[0.0]], budget)
                note = f"auto:tau:{budget} (expected {1 + expected_accepted(tree, table):.2f} tokens/forward)"
        except DraftheadsError:   # the drafter never matched the target on the calibration prompts
            tree, note = Tree.chain(1), f"auto:{budget} -> chain:1 (no draft matched during calibration)"
        entry.tree, entry.depth = tree, tree.depth
        print(f"draftheads eval: {entry.name}: {note}: {describe_tree(tree)}", flush=True)
        entry.info.update(tree=f"{describe_tree(tree)} (auto)", auto_tree=note, accuracy_table=table,
                          tree_paths=list(tree.paths))
    for entry in entries:
        if entry.kind == "combined":
            source = learned_source(entries, entry)
            entry.tree, entry.depth = source.tree, source.depth
            entry.info.update(tree=f"{source.info['tree']} + {entry.info['copied']}")


def price_gates(cal: Calibration, entries: list[Entry]) -> None:
    """Give each gated combination (decoding/gate.py) the cost of its learned tree on this machine: the steps of
    prompt lookup alone and of the combination drafting the learned tree every step, timed on the calibration
    prompts (the profile's estimate at the evaluated prompts' mean context where a situation never came up)."""
    gated = [e for e in entries if e.kind == "combined" and e.info["mode"] == "gate"]
    if not gated:
        return

    def timed(entry: Entry) -> GenerationStats:   # one prompt at a time: a batch shares its steps' time among rows
        return GenerationStats.merged(cal.runs(entry, RunConfig("greedy", 0.0), [c])[0].stats
                                      for c in cal.conversations)

    alone = {copier: timed(copier_entry(entries, entry)) for copier, entry in
             {entry.info["copier"]: entry for entry in gated}.items()}
    context = sum(cal.lengths) / max(1, len(cal.lengths)) + cal.settings.decode.max_new_tokens / 2
    for entry in gated:
        source = learned_source(entries, entry)
        used = source.used_tree
        estimated = []

        def estimate() -> GateCosts:   # called only for a situation the calibration prompts never met
            estimated.append(gate_costs(cal.profile, profile_entry(cal, source),
                                        used.num_nodes, used.depth, entry.drafter.copy_nodes, context))
            return estimated[-1]

        # timed before it has a gate: the plain graft, drafting the learned tree every step
        costs = measured_costs(alone[entry.info["copier"]], timed(entry), used.num_nodes, estimate)
        entry.drafter.gate = LearnedGate(costs)
        entry.info["gate"] = (f"learned tree drafted while its added tokens / lookup's beat what it adds to a step: "
                              f"{costs.without_chain:.2f} without a lookup chain, {costs.with_chain:.2f} with one")
        if estimated:
            entry.info["gate"] += (f" (a situation the calibration prompts never met takes the profile's estimate: "
                                   f"{estimated[0].without_chain:.2f}, {estimated[0].with_chain:.2f})")
        print(f"draftheads eval: {entry.name}: {entry.info['gate']}", flush=True)


def price_schedules(cal: Calibration, entries: list[Entry]) -> None:
    """Give each learned drafter that verifies by confidence (DSpark's `head.verify: scheduled`) this machine's costs:
    its draft pass and a verify forward of 1..depth + 1 tokens, from the cost profiles at the evaluated prompts'
    mean context (heads/parts/dspark_drafting.py weighs each draft's confidence against them)."""
    scheduled = [e for e in entries
                 if e.kind == "learned" and getattr(e.drafter.config, "verify", "all") == "scheduled"]
    if not scheduled:
        return
    context = sum(cal.lengths) / max(1, len(cal.lengths)) + cal.settings.decode.max_new_tokens / 2
    step = cal.profile.decode_step(context)
    for entry in scheduled:
        used = entry.used_tree
        draft = profile_entry(cal, entry).step_in_decode_steps(used.depth, used.num_nodes) * step
        verify = tuple(cal.profile.forward(n, context) for n in range(1, used.depth + 2))
        entry.drafter.set_verify_costs(VerifyCosts(draft_s=draft, verify_s=verify))
        entry.info["schedule"] = (f"chains cut where confidence stops paying: draft {draft * 1e3:.1f} ms, verify "
                                  + " / ".join(f"{t * 1e3:.1f}" for t in verify) + f" ms for 1..{len(verify)} tokens")
        print(f"draftheads eval: {entry.name}: {entry.info['schedule']}", flush=True)
