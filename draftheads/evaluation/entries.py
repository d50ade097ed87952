"""The drafters under test (`Entry`), built from drafter specs (evaluation/drafter_specs.py): the prompt-lookup
baseline first, then each learned drafter and its combinations with prompt lookup."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftheads.core.config import to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import DynamicTreeSpec, Tree
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.evaluation.drafter_specs import LOOKUP_NAMES, MODE_SUFFIX, split_spec
from draftheads.evaluation.report import describe_tree
from draftheads.evaluation.saved_runs import run_recipe
from draftheads.interop.load import load_drafter
from draftheads.interop.native import resolve_drafter_folder

LOOKUP_DEPTH = 6   # the prompt-lookup chain a combination grafts onto the learned tree


@dataclass
class Entry:
    """A drafter under test. tree: what speculative_generate gets (None = the drafter's default);
    depth: K of the chain formula (draft levels per step); draft_limit: the deepest tree the drafter
    can draft (Medusa's heads, MTP's modules; None: any)."""

    name: str
    kind: str  # 'lookup' | 'learned' | 'combined'
    drafter: object
    tree: object
    depth: int
    info: dict = field(default_factory=dict)
    draft_limit: int | None = None

    @property
    def used_tree(self) -> Tree | DynamicTreeSpec:
        """The tree it drafts: the one given, else the drafter's default."""
        return self.tree if self.tree is not None else self.drafter.default_tree

    @property
    def nodes(self) -> int:
        """Tree nodes a step verifies at most (a combination's lookup chain included)."""
        return self.used_tree.num_nodes + (self.drafter.lookup_depth if self.kind == "combined" else 0)


def build_entries(specs: list[str], model, requested: Tree | DynamicTreeSpec | None,
                  combined: list[str] = ()) -> list[Entry]:
    """The prompt-lookup baseline first, then each learned drafter (and its combinations with lookup: modes
    'graft', 'switch' and 'gate', from the spec's suffix and `combined`)."""
    lookup_tree = requested if isinstance(requested, Tree) else None
    entries = [lookup_entry(lookup_tree)]
    learned = {}
    for spec in specs:
        path, mode = split_spec(spec)
        if path in LOOKUP_NAMES:
            continue
        if path not in learned:
            learned[path] = learned_entry(path, model, requested, [e.name for e in entries])
            entries.append(learned[path])
        for each in ([mode] if mode else []) + list(combined):
            name = learned[path].name + MODE_SUFFIX[each]
            if name not in [e.name for e in entries]:
                entries.append(combined_entry(learned[path], name, each))
    return entries


def lookup_entry(tree: Tree | None) -> Entry:
    drafter = PromptLookupDrafter()
    used = tree or drafter.default_tree
    return Entry("prompt-lookup", "lookup", drafter, tree, used.depth,
                 {"tree": describe_tree(used), "max_ngram": drafter.max_ngram, "min_ngram": drafter.min_ngram})


def learned_entry(path: str, model, tree, taken: list[str]) -> Entry:
    folder = resolve_drafter_folder(path)
    drafter = load_drafter(folder, model)
    used = tree or drafter.default_tree
    if isinstance(used, DynamicTreeSpec) and drafter.config.type in ("medusa", "medusa2"):
        raise DraftheadsError(f"{path}: Medusa heads draft static trees; give --tree chain:K or static:PATHS, "
                              "not dynamic")
    name = drafter_name(folder)
    while name in taken:
        name += "'"
    info = {"path": str(path), "folder": str(folder), "type": drafter.config.type, "head": to_dict(drafter.config),
            "tree": describe_tree(used), "recipe": run_recipe(folder)}
    return Entry(name, "learned", drafter, tree, used.depth, info, draft_limit=drafter.config.depth)


def combined_entry(learned: Entry, name: str, mode: str = "graft") -> Entry:
    """The combination of `learned` with prompt lookup in `mode`; a gate is given its costs once the tree and the
    machine's profile are known (evaluation/calibration.py: price_gates)."""
    drafter = CombinedDrafter(learned.drafter, lookup_depth=LOOKUP_DEPTH, switch=mode == "switch")
    info = {**learned.info, "combined_with": "prompt-lookup", "mode": mode, "lookup_depth": drafter.lookup_depth,
            "tree": f"{learned.info['tree']} + lookup chain:{drafter.lookup_depth}",
            "switch": f"lookup chain alone after {drafter.copy_after}+ copied tokens" if mode == "switch" else None}
    return Entry(name, "combined", drafter, learned.tree, learned.depth, info, draft_limit=learned.draft_limit)


def learned_source(entries: list[Entry], combined: Entry) -> Entry:
    """The learned drafter's entry a combination was built on."""
    return next(e for e in entries if e.kind == "learned" and e.drafter is combined.drafter.learned)


def drafter_name(folder: Path) -> str:
    """The run's name for runs/<name>/final/drafter or runs/<name>/step_N/drafter, else the folder's name."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-1] == "drafter" and (parts[-2] == "final" or parts[-2].startswith("step_")):
        return parts[-3] if parts[-2] == "final" else f"{parts[-3]}@{parts[-2]}"
    return folder.name


def entry_info(entry: Entry) -> dict:
    return {"name": entry.name, "kind": entry.kind, "depth": entry.depth, **entry.info}
