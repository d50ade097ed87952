"""The drafters under test (`Entry`), built from drafter specs (measurement/drafter_specs.py): the prompt-lookup
baseline first, suffix decoding when asked for, then each learned drafter and its combinations with either."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from draftheads.core.config import to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import BEST, DRAFTER, FINAL, STEP_RE, run_recipe
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.suffix import OutputCache, SuffixDrafter
from draftheads.interop.load import load_drafter
from draftheads.interop.native import resolve_drafter_folder
from draftheads.measurement.drafter_specs import SUFFIX_NAMES, combination_name, model_free, split_spec

LOOKUP_DEPTH = 6   # the prompt-lookup chain a combination grafts onto the learned tree


def describe_tree(tree) -> str:
    """A short label: chain:K, dynamic:K,D,T or static(N nodes, depth D)."""
    if isinstance(tree, DynamicTreeSpec):
        return f"dynamic:{tree.top_k},{tree.depth},{tree.total_tokens}"
    if isinstance(tree, Tree):
        if tree.is_chain:
            return f"chain:{tree.depth}"
        return f"static({tree.num_nodes - 1} nodes, depth {tree.depth})"
    return str(tree)


@dataclass
class Entry:
    """A drafter under test. tree: what speculative_generate gets (None = the drafter's default);
    depth: K of the chain formula (draft levels per step); draft_limit: the deepest tree the drafter
    can draft (Medusa's heads, MTP's modules; None: any)."""

    name: str
    kind: str  # 'lookup' | 'suffix' | 'learned' | 'combined'
    drafter: object
    tree: object
    depth: int
    info: dict = field(default_factory=dict)
    draft_limit: int | None = None
    suffix: SuffixDrafter | None = None   # its suffix-decoding part, whose output cache a run starts empty
    plain_above: int | None = None        # decode plainly above this many live rows (`--plain-above auto`)

    @property
    def used_tree(self) -> Tree | DynamicTreeSpec:
        """The tree it drafts: the one given, else the drafter's default."""
        return self.tree if self.tree is not None else self.drafter.default_tree

    @property
    def nodes(self) -> int:
        """Tree nodes a step verifies at most (a combination's copied paths included)."""
        return self.used_tree.num_nodes + (self.drafter.copy_nodes if self.kind == "combined" else 0)

    def output_cache(self) -> OutputCache | None:
        """An empty output cache for its suffix-decoding part (None without one): each run over the prompts starts
        with its own, as a fresh server process would, so no run sees outputs of the same prompts from another."""
        return self.suffix.outputs.emptied() if self.suffix is not None else None


def build_entries(specs: list[str], model, requested: Tree | DynamicTreeSpec | None,
                  combined: list[str] = ()) -> list[Entry]:
    """The prompt-lookup baseline first, suffix decoding when a spec names it (alone or in a combination; both
    draft their own trees unless a static one is asked for), then each learned drafter (and its combinations:
    modes 'graft', 'switch' and 'gate' with the copier a spec names, and `combined` modes with prompt lookup)."""
    lookup_tree = requested if isinstance(requested, Tree) else None
    entries = [lookup_entry(lookup_tree)]
    parts = [split_spec(spec) for spec in specs]
    if any(path in SUFFIX_NAMES or copier == "suffix" for path, copier, _ in parts):
        entries.append(suffix_entry(lookup_tree))
    learned = {}
    for path, copier, mode in parts:
        if model_free(path):
            continue
        if path not in learned:
            learned[path] = learned_entry(path, model, requested, [e.name for e in entries])
            entries.append(learned[path])
        wanted = ([(copier, mode)] if mode else []) + [("lookup", each) for each in combined]
        for each_copier, each_mode in wanted:
            name = combination_name(learned[path].name, each_copier, each_mode)
            if name not in [e.name for e in entries]:
                entries.append(combined_entry(learned[path], name, each_mode, each_copier))
    return entries


def lookup_entry(tree: Tree | None) -> Entry:
    drafter = PromptLookupDrafter()
    used = tree or drafter.default_tree
    return Entry("prompt-lookup", "lookup", drafter, tree, used.depth,
                 {"tree": describe_tree(used), "max_ngram": drafter.max_ngram, "min_ngram": drafter.min_ngram})


def suffix_entry(tree: Tree | DynamicTreeSpec | None) -> Entry:
    drafter = SuffixDrafter()
    used = tree or drafter.default_tree
    return Entry("suffix", "suffix", drafter, tree, used.depth, {"tree": describe_tree(used), **suffix_info(drafter)},
                 suffix=drafter)


def suffix_info(drafter: SuffixDrafter) -> dict:
    return {"max_match": drafter.max_match, "max_nodes": drafter.max_nodes, "spec_factor": drafter.spec_factor,
            "min_prob": drafter.min_prob, "max_cached_tokens": drafter.outputs.max_tokens}


def learned_entry(path: str, model, tree, taken: list[str]) -> Entry:
    folder = resolve_drafter_folder(path)
    drafter = load_drafter(folder, model)
    used = tree or drafter.default_tree
    if isinstance(used, DynamicTreeSpec) and drafter.config.type in ("medusa", "medusa2"):
        raise DraftheadsError(f"{path}: Medusa heads draft static trees; give --tree chain:K or static:PATHS, "
                              "not dynamic")
    limit = drafter.config.depth
    if used.depth > limit:   # refused here, before the profile and the runs, not at the first draft minutes later
        raise DraftheadsError(f"{path}: the tree {describe_tree(used)} is {used.depth} deep, but this "
                              f"{drafter.config.type} drafter drafts at most {limit} levels; give a --tree (or "
                              f"--preset) of depth <= {limit}")
    name = drafter_name(folder)
    while name in taken:
        name += "'"
    info = {"path": str(path), "folder": str(folder), "type": drafter.config.type, "head": to_dict(drafter.config),
            "tree": describe_tree(used), "recipe": run_recipe(folder)}
    return Entry(name, "learned", drafter, tree, used.depth, info, draft_limit=drafter.config.depth)


def combined_entry(learned: Entry, name: str, mode: str = "graft", copier: str = "lookup") -> Entry:
    """The combination of `learned` with prompt lookup or suffix decoding (`copier`) in `mode`; a gate is given its
    costs once the tree and the machine's profile are known (costmodel/calibration.py: price_gates)."""
    suffix = SuffixDrafter() if copier == "suffix" else None
    drafter = CombinedDrafter(learned.drafter, suffix or PromptLookupDrafter(), lookup_depth=LOOKUP_DEPTH,
                              switch=mode == "switch")
    copied = (f"suffix tree of up to {drafter.copy_nodes} nodes, {LOOKUP_DEPTH} deep" if suffix
              else f"lookup chain:{drafter.lookup_depth}")
    info = {**learned.info, "combined_with": "suffix" if suffix else "prompt-lookup", "copier": copier, "mode": mode,
            "lookup_depth": drafter.lookup_depth, "copied": copied, "tree": f"{learned.info['tree']} + {copied}",
            **(suffix_info(suffix) if suffix else {}),
            "switch": f"copied paths alone after {drafter.copy_after}+ copied tokens" if mode == "switch" else None}
    return Entry(name, "combined", drafter, learned.tree, learned.depth, info, draft_limit=learned.draft_limit,
                 suffix=suffix)


def copier_entry(entries: list[Entry], combined: Entry) -> Entry:
    """The model-free drafter's own entry (prompt lookup or suffix decoding) a combination was built with."""
    return next(e for e in entries if e.kind == combined.info["copier"])


def learned_source(entries: list[Entry], combined: Entry) -> Entry:
    """The learned drafter's entry a combination was built on."""
    return next(e for e in entries if e.kind == "learned" and e.drafter is combined.drafter.learned)


def drafter_name(folder: Path) -> str:
    """The run's name for runs/<name>/final/drafter, runs/<name>/best/drafter or runs/<name>/step_N/drafter (the
    latter two as <name>@best and <name>@step_N), else the folder's name."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-1] == DRAFTER:
        if parts[-2] == FINAL:
            return parts[-3]
        if parts[-2] == BEST or STEP_RE.match(parts[-2]):
            return f"{parts[-3]}@{parts[-2]}"
    return folder.name


def entry_info(entry: Entry) -> dict:
    return {"name": entry.name, "kind": entry.kind, "depth": entry.depth, **entry.info}


def plain_above_entry(entry: Entry, rows: int) -> Entry:
    """The same drafter decoding plainly while more than `rows` rows are live (`--plain-above auto`), measured
    beside it as '<name>@auto'."""
    info = {**entry.info, "plain_above": rows, "plain_above_from": entry.name}
    return dataclasses.replace(entry, name=f"{entry.name}@auto", info=info, plain_above=rows)
