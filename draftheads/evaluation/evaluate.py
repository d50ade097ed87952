"""`draftheads eval`: acceptance and real speedup of drafters against plain decoding of the same target.

    folder = run_eval(["runs/eagle-smollm2"], prompts="humaneval", limit=20, accept=["greedy", "strict"],
                      temperatures=[0.0, 0.7])          # -> folder with report.json, report.md, *.png
    folder = run_eval(["runs/eagle-smollm2"], batch_sizes=[1, 2, 4, 8, 16])   # + the speedup-vs-batch curve

Drafter specs: a drafter or run folder (a learned drafter); 'lookup' (prompt lookup, which is always
measured anyway as the no-training baseline); 'FOLDER+lookup' (that drafter combined with prompt
lookup, see decoding/combined.py); 'FOLDER+lookup-switch' (the same, verifying the lookup chain alone
while the text is being copied); 'FOLDER+lookup-gate' (the same, drafting the learned tree only while it
pays, see decoding/gate.py). `combined=True` or 'graft' adds the first for every learned drafter,
'switch' the second, 'gate' the third, 'all' the three.
"""

from __future__ import annotations

import collections
import copy
import datetime
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from draftheads.core.config import build, to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import RECIPE_FILE
from draftheads.core.tree import AutoTreeSpec, DynamicTreeSpec, Tree, parse_tree
from draftheads.data.chat import stop_token_ids
from draftheads.data.hardware import dtype_name
from draftheads.data.prompts import PromptSource, load_source
from draftheads.data.target import attach_chat_template, load_target
from draftheads.decoding.accept import check_rule
from draftheads.decoding.combined import CombinedDrafter
from draftheads.decoding.gate import GateCosts, LearnedGate, gate_costs, measured_costs
from draftheads.decoding.lookup import PromptLookupDrafter
from draftheads.decoding.stats import GenerationStats, shared_prefix_length
from draftheads.evaluation.auto_tree import auto_tree, expected_accepted
from draftheads.evaluation.cost_model import StepShape, fastest_tree, predict
from draftheads.evaluation.earlier_report import EarlierReport, read_earlier
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.measure import (
    Conversation,
    Entry,
    EvalSettings,
    Measurements,
    RunConfig,
    first_chat,
    generate_conversations,
    measure,
    plan_configs,
)
from draftheads.evaluation.plots import write_plots
from draftheads.evaluation.profile import (
    context_limit,
    drafter_profile,
    folder_fingerprint,
    rule_setting,
    target_profile,
)
from draftheads.evaluation.report import (
    batch_curve,
    describe_tree,
    environment,
    format_batch_table,
    format_table,
    now,
    summarise,
    write_report,
)
from draftheads.interop.load import load_drafter
from draftheads.interop.native import (
    read_config,
    resolve_drafter_folder,
    target_summary,
)

LOOKUP_NAMES = ("lookup", "prompt-lookup")


def run_eval(drafters: list[str], *, target: str | None = None, prompts: str = "humaneval", limit: int | None = None,
             accept: list[str] = ("greedy",), temperatures: list[float] = (0.0,), tree: str | None = None,
             max_new_tokens: int = 128, dtype: str = "auto", out: str | None = None, target_model=None,
             combined: bool | str = False, seed: int = 0, top_k: int = 0, top_p: float = 1.0, typical_epsilon: float = 0.09,
             typical_delta: float = 0.3, batch_sizes: list[int] = (1,), plain_above: int | None = None,
             refresh_profile: bool = False, tau_from: str | None = None, progress: bool = True) -> Path:
    """Measure every drafter x rule x temperature on the prompts; write and print the report; return its folder.

    batch_sizes: decode the prompts in batches of each of these sizes (interleaved); more than batch size 1
    adds the speedup-vs-batch table and plot, and the batch size at which each drafter stops paying.
    plain_above: decode plainly while more than this many rows of a batch are generating.
    target_model: (model, tokenizer) to use instead of loading `target` (tests, the demo).
    refresh_profile: time the target again instead of reading this machine's cached cost profile.
    tau_from: an earlier evaluation's report; its tau and nodes per step (never its timings) feed the predictions of
    the rows it measured with the same drafter, tree, rule and temperature, instead of the calibration prompts'.
    """
    check_settings(accept, temperatures, max_new_tokens, limit)
    combined = combined_modes(combined)
    batch_sizes = check_batch_settings(batch_sizes, plain_above)
    check_report_folder(out)  # before minutes of work, not after
    earlier = read_earlier(tau_from) if tau_from else None
    requested = parse_tree(tree)
    budget = requested.budget if isinstance(requested, AutoTreeSpec) else None
    model, tokenizer, target_info = load_eval_target(target, dtype, drafters, target_model)
    entries = build_entries(drafters, model, None if budget else requested, combined)
    configs = plan_configs(accept, temperatures)
    settings = eval_settings(model, tokenizer, entries, max_new_tokens, seed, top_k, top_p, typical_epsilon, typical_delta,
                             extra_nodes=max(budget + 1 + LOOKUP_DEPTH, COMB_WIDTH * COMB_DEPTH + 1) if budget else 1)
    conversations, skipped, calibration = load_conversations(prompts, limit, tokenizer, settings, CALIBRATION_PROMPTS)
    rules = {(c.rule, c.temperature, top_k, top_p) for c in configs} | {("strict", c.temperature, top_k, top_p) for c in configs}
    profile = target_profile(model, refresh=refresh_profile, rules=sorted(rules), progress=lambda line: print(line, flush=True))
    lengths = [len(first_chat(tokenizer, c, settings).input_ids) for c in conversations]
    if budget:
        fit_auto_trees(model, tokenizer, entries, calibration, settings, requested, profile, lengths)
    price_gates(model, tokenizer, entries, calibration, settings, profile, lengths)
    predictions = predict_entries(model, tokenizer, entries, configs, calibration, settings, profile, lengths, earlier)
    print(f"draftheads eval: {len(conversations)} prompts from {prompts}, {len(entries)} drafters "
          f"({', '.join(e.name for e in entries)}), {len(configs)} rule/temperature settings, target {target_info['name']} "
          f"in {target_info['dtype']}", flush=True)
    found = measure(model, tokenizer, conversations, entries, configs, settings, progress, batch_sizes, plain_above)
    rows = [row for size, at_size in found.items() for row in build_rows(at_size, entries, configs, conversations, size)]
    for row in rows:
        row.update(prediction_columns(predictions.get((row["drafter"], row["rule"], row["temperature"])), row))
    folder = report_folder(out, drafters)
    report = {
        "created": now(), "target": target_info, "environment": environment(),
        "settings": {
            "drafters": list(drafters), "prompts": prompts, "limit": limit, "accept": list(accept),
            "temperatures": [float(t) for t in temperatures], "tree": tree, "max_new_tokens": max_new_tokens,
            "dtype": target_info["dtype"], "seed": seed, "seed_rule": "seed + 1000 * prompt index + turn, same for plain and speculative",
            "top_k": top_k, "top_p": top_p, "combined": combined, "typical_epsilon": typical_epsilon,
            "typical_delta": typical_delta, "stop_ids": settings.stop_ids, "batch_sizes": batch_sizes,
            "plain_above": plain_above, "calibration_prompts": [c.prompt_id for c in calibration],
            "tau_from": str(earlier.path) if earlier else None,
        },
        "cost_profile": {"key": profile.key, "created": profile.created},
        **results_section(found, entries, conversations, skipped, rows),
    }
    report["plots"] = write_plots(folder, rows, report["by_kind"]) if rows else []
    write_report(folder, report)
    print(format_table(rows))
    if report["batch_curve"]:
        print(format_batch_table(report["batch_curve"]))
    broken = [r["drafter"] for r in rows if r["greedy_mismatches"]]
    if broken and target_info["dtype"] == "fp32":
        print(f"draftheads eval: WARNING: in fp32 greedy speculative output must equal plain decoding, but {', '.join(broken)} "
              "differed (see mismatched_prompts in report.json): the drafter integration or the loop is broken", flush=True)
    print(f"draftheads eval: report in {folder}/report.md (tau includes the bonus token)", flush=True)
    return folder


def results_section(found: dict[int, Measurements], entries, conversations, skipped: dict, rows: list[dict]) -> dict:
    """plain: the plain runs' summary per temperature ('greedy', 'T=0.7'; prefixed 'B=4 ' beyond batch size 1)."""
    plain = {}
    for size, at_size in found.items():
        for key, runs in at_size.plain.items():
            name = "greedy" if key == 0 else f"T={key:g}"
            if list(found) != [1]:
                name = f"B={size} {name}"
            plain[name] = GenerationStats.merged(o.stats for o in runs).summary()
    return {"drafters": [entry_info(e) for e in entries], "prompt_count": len(conversations),
            "prompts_skipped": sum(skipped.values()), "skipped_reasons": skipped, "plain": plain, "results": rows,
            "batch_curve": batch_curve(rows) if set(found) != {1} else [],
            "by_kind": kind_rows(found[min(found)], entries, conversations),
            "by_prompt": prompt_rows(found[min(found)], conversations)}


def kind_rows(found: Measurements, entries: list[Entry], conversations) -> list[dict]:
    """The table's rows again for each task kind of the prompts (none when they have no kinds), from the same runs."""
    kinds = sorted({c.kind for c in conversations if c.kind})
    configs = list(dict.fromkeys(cfg for _, cfg in found.spec))
    rows = []
    for kind in kinds:
        keep = [i for i, c in enumerate(conversations) if c.kind == kind]
        part = Measurements({key: [runs[i] for i in keep] for key, runs in found.plain.items()},
                            {key: [runs[i] for i in keep] for key, runs in found.spec.items()})
        for row in build_rows(part, entries, configs, [conversations[i] for i in keep]):
            rows.append({"task_kind": kind, "task_prompts": len(keep), **row})
    return rows


def prompt_rows(found: Measurements, conversations) -> list[dict]:
    """One row per prompt x drafter x config from the same runs: where a total comes from (a few prompts whose
    target output loops or echoes the prompt can carry prompt lookup's tau for a whole kind)."""
    rows = []
    for (name, cfg), outputs in found.spec.items():
        plain = found.plain[cfg.plain_key]
        for conv, out, base in zip(conversations, outputs, plain):
            rows.append({"prompt_id": conv.prompt_id, "task_kind": conv.kind, "prompt": conv.users[0][:60],
                         "drafter": name, "rule": cfg.rule, "temperature": cfg.temperature,
                         "new_tokens": out.stats.new_tokens, "steps": out.stats.steps, "tau": out.stats.tau,
                         "plain_tokens": len(base.tokens), "same_as_plain": None if cfg.sampled else out.tokens == base.tokens})
    return rows


def check_settings(accept, temperatures, max_new_tokens: int, limit) -> None:
    for rule in accept:
        check_rule(rule)
    if not accept or not temperatures:
        raise DraftheadsError("give at least one acceptance rule and one temperature")
    if any(not math.isfinite(t) or t < 0 for t in temperatures):
        raise DraftheadsError(f"temperatures must be finite numbers >= 0, got {list(temperatures)}")
    if max_new_tokens < 1 or (limit is not None and limit < 1):
        raise DraftheadsError("max_new_tokens and limit must be positive")


def check_batch_settings(batch_sizes, plain_above) -> list[int]:
    """The batch sizes, each once, smallest first."""
    sizes = list(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise DraftheadsError(f"batch sizes must be whole numbers >= 1, got {sizes}; e.g. --batch-size 1,2,4,8,16")
    if plain_above is not None and (isinstance(plain_above, bool) or not isinstance(plain_above, int) or plain_above < 1):
        raise DraftheadsError(f"plain_above must be a whole number >= 1 (decode plainly above that many rows), got {plain_above}")
    return sorted(set(sizes))


# ---------------------------------------------------------------- target and drafters


def load_eval_target(spec: str | None, dtype: str, drafters: list[str], target_model=None):
    """(model, tokenizer, info): the given pair, or `spec`, or the target the first learned drafter names."""
    if target_model is not None:
        model, tokenizer = target_model
        name = spec or getattr(model, "name_or_path", None) or type(model).__name__
    else:
        name = spec or saved_target_name(drafters) or "smollm2-135m"
        model, tokenizer = load_target(name, dtype=dtype)
    template_kwargs = saved_template_kwargs(drafters)
    if template_kwargs:   # prompted as the drafter's data was (a copy: the caller's tokenizer stays as it was)
        tokenizer = copy.copy(tokenizer)
        attach_chat_template(tokenizer, None, str(name), template_kwargs)
    info = {**target_summary(model), "name": str(name), "dtype": dtype_name(model.dtype), "device": str(model.device),
            "attn_implementation": getattr(model.config, "_attn_implementation", None), "chat_template_kwargs": template_kwargs}
    return model, tokenizer, info


def saved_template_kwargs(drafters: list[str]) -> dict:
    """data.chat_template_kwargs of the recipe the first learned drafter was trained with ({} when none)."""
    return dict(((first_run_recipe(drafters) or {}).get("data") or {}).get("chat_template_kwargs") or {})


def first_run_recipe(drafters: list[str]) -> dict | None:
    """The recipe saved with the first learned drafter's run (None: prompt lookup only, or a folder without its run)."""
    paths = learned_paths(drafters)
    return run_recipe(resolve_drafter_folder(paths[0])) if paths else None


MODE_SUFFIX = {"graft": "+lookup", "switch": "+lookup-switch", "gate": "+lookup-gate"}   # drafter spec / report name
COMBINED_MODES = {"graft": ["graft"], "switch": ["switch"], "gate": ["gate"], "all": ["graft", "switch", "gate"]}


def combined_modes(combined: bool | str) -> list[str]:
    """--combined: False -> none; True or 'graft' -> lookup grafted onto every learned tree; 'switch'; 'gate'; 'all'."""
    if combined is False or combined is None:
        return []
    if combined is True:
        return ["graft"]
    if combined not in COMBINED_MODES:
        raise DraftheadsError(f"--combined takes {', '.join(COMBINED_MODES)}, got {combined!r}")
    return COMBINED_MODES[combined]


def split_spec(spec: str) -> tuple[str, str | None]:
    """'FOLDER+lookup-switch' -> ('FOLDER', 'switch'); a spec without a lookup suffix -> (spec, None)."""
    for mode, suffix in MODE_SUFFIX.items():
        if spec.endswith(suffix):
            return spec[: -len(suffix)], mode
    return spec, None


def learned_paths(specs: list[str]) -> list[str]:
    """The learned drafters' folders among drafter specs ('FOLDER', 'FOLDER+lookup'; lookup itself left out)."""
    paths = (split_spec(spec)[0] for spec in specs)
    return [path for path in paths if path not in LOOKUP_NAMES]


def saved_target_name(drafters: list[str]) -> str | None:
    """The target a learned drafter was trained for, from its config.json."""
    for path in learned_paths(drafters):
        saved = read_config(resolve_drafter_folder(path)).get("target") or {}
        if saved.get("name"):
            return saved["name"]
    return None


def saved_eval_settings(drafters: list[str]):
    """The eval: section of the recipe saved with the first learned drafter's run, else EvalConfig's defaults
    (prompt lookup only, a drafter folder without its run, a run whose recipe has no eval section)."""
    saved = first_run_recipe(drafters)
    return build(EvalConfig, saved["eval"], "eval") if saved and saved.get("eval") else EvalConfig()


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
    used = tree or drafter.default_tree()
    return Entry("prompt-lookup", "lookup", drafter, tree, used.depth,
                 {"tree": describe_tree(used), "max_ngram": drafter.max_ngram, "min_ngram": drafter.min_ngram})


def learned_entry(path: str, model, tree, taken: list[str]) -> Entry:
    folder = resolve_drafter_folder(path)
    drafter = load_drafter(folder, model)
    used = tree or drafter.default_tree()
    if isinstance(used, DynamicTreeSpec) and drafter.config.type == "medusa":
        raise DraftheadsError(f"{path}: Medusa heads draft static trees; give --tree chain:K or static:PATHS, not dynamic")
    name = drafter_name(folder)
    while name in taken:
        name += "'"
    info = {"path": str(path), "folder": str(folder), "type": drafter.config.type, "head": to_dict(drafter.config),
            "tree": describe_tree(used), "recipe": run_recipe(folder)}
    return Entry(name, "learned", drafter, tree, used.depth, info, draft_limit=drafter.config.depth)


def combined_entry(learned: Entry, name: str, mode: str = "graft") -> Entry:
    """The combination of `learned` with prompt lookup in `mode`; a gate is given its costs once the tree and the
    machine's profile are known (price_gates)."""
    drafter = CombinedDrafter(learned.drafter, lookup_depth=LOOKUP_DEPTH, switch=mode == "switch")
    info = {**learned.info, "combined_with": "prompt-lookup", "mode": mode, "lookup_depth": drafter.lookup_depth,
            "tree": f"{learned.info['tree']} + lookup chain:{drafter.lookup_depth}",
            "switch": f"lookup chain alone after {drafter.copy_after}+ copied tokens" if mode == "switch" else None}
    return Entry(name, "combined", drafter, learned.tree, learned.depth, info, draft_limit=learned.draft_limit)


def drafter_name(folder: Path) -> str:
    """The run's name for runs/<name>/final/drafter or runs/<name>/step_N/drafter, else the folder's name."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-1] == "drafter" and (parts[-2] == "final" or parts[-2].startswith("step_")):
        return parts[-3] if parts[-2] == "final" else f"{parts[-3]}@{parts[-2]}"
    return folder.name


def run_recipe(folder: Path) -> dict | None:
    """The resolved recipe saved with the run that produced this drafter (newest checkpoint's copy)."""
    run = folder.resolve().parent.parent
    copies = sorted(run.glob(f"step_*/{RECIPE_FILE}"))
    return yaml.safe_load(copies[-1].read_text()) if copies else None


def entry_info(entry: Entry) -> dict:
    return {"name": entry.name, "kind": entry.kind, "depth": entry.depth, **entry.info}


# ---------------------------------------------------------------- automatic trees

COMB_WIDTH, COMB_DEPTH, CALIBRATION_PROMPTS, LOOKUP_DEPTH, UNIT_TOKENS = 8, 6, 6, 6, 32


def comb_tree(width: int, depth: int) -> Tree:
    """`width` candidates at every depth below the rank-0 path: measures P(rank r accepted | depth reached)."""
    return Tree.from_paths([(0,) * d + (r,) for d in range(depth) for r in range(width)])


def fit_auto_trees(model, tokenizer, entries: list[Entry], calibration, settings: EvalSettings, spec: AutoTreeSpec,
                   profile, lengths: list[int]) -> None:
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
        runs = [generate_conversations(model, tokenizer, [c], probe, RunConfig("greedy", 0.0), settings)[0]
                for c in calibration]
        table = [row + [0.0] * (COMB_WIDTH - len(row)) for row in GenerationStats.merged(r.stats for r in runs).rank_accuracy]
        try:
            if spec.objective == "speed":
                costs = profile_entry(model, tokenizer, entry, calibration, settings)
                tree, figures = fastest_tree(profile, costs, table or [[0.0]], lengths, settings.max_new_tokens,
                                             max_budget=budget)
                note = (f"auto:{budget} -> {tree.num_nodes - 1} nodes (predicted {figures['tau']:.2f} tokens/forward, "
                        f"{figures['speedup']:.2f}x)")
            else:
                tree = auto_tree(table or [[0.0]], budget)
                note = f"auto:tau:{budget} (expected {1 + expected_accepted(tree, table):.2f} tokens/forward)"
        except DraftheadsError:   # the drafter never matched the target on the calibration prompts
            tree, note = Tree.chain(1), f"auto:{budget} -> chain:1 (no draft matched during calibration)"
        entry.tree, entry.depth = tree, tree.depth
        print(f"draftheads eval: {entry.name}: {note}: {describe_tree(tree)}", flush=True)
        entry.info.update(tree=f"{describe_tree(tree)} (auto)", auto_tree=note, accuracy_table=table, tree_paths=list(tree.paths))
    for entry in entries:
        if entry.kind == "combined":
            source = learned_source(entries, entry)
            entry.tree, entry.depth = source.tree, source.depth
            entry.info.update(tree=f"{source.info['tree']} + lookup chain:{entry.drafter.lookup_depth}")


def learned_source(entries: list[Entry], combined: Entry) -> Entry:
    """The learned drafter's entry a combination was built on."""
    return next(e for e in entries if e.kind == "learned" and e.drafter is combined.drafter.learned)


def price_gates(model, tokenizer, entries: list[Entry], calibration, settings: EvalSettings, profile,
                lengths: list[int]) -> None:
    """Give each gated combination (decoding/gate.py) the cost of its learned tree on this machine: the steps of
    prompt lookup alone and of the combination drafting the learned tree every step, timed on the calibration
    prompts (the profile's estimate at the evaluated prompts' mean context where a situation never came up)."""
    gated = [e for e in entries if e.kind == "combined" and e.info["mode"] == "gate"]
    if not gated:
        return

    def timed(entry: Entry) -> GenerationStats:   # one prompt at a time: a batch shares its steps' time among rows
        return GenerationStats.merged(generate_conversations(model, tokenizer, [c], entry, RunConfig("greedy", 0.0),
                                                             settings)[0].stats for c in calibration)

    alone = timed(next(e for e in entries if e.kind == "lookup"))
    context = sum(lengths) / max(1, len(lengths)) + settings.max_new_tokens / 2
    for entry in gated:
        source = learned_source(entries, entry)
        used = source.tree if source.tree is not None else source.drafter.default_tree()
        estimated = []

        def estimate() -> GateCosts:   # called only for a situation the calibration prompts never met
            estimated.append(gate_costs(profile, profile_entry(model, tokenizer, source, calibration, settings),
                                        used.num_nodes, used.depth, entry.drafter.lookup_depth, context))
            return estimated[-1]

        # timed before it has a gate: the plain graft, drafting the learned tree every step
        costs = measured_costs(alone, timed(entry), used.num_nodes, estimate)
        entry.drafter.gate = LearnedGate(costs)
        entry.info["gate"] = (f"learned tree drafted while its added tokens / lookup's beat what it adds to a step: "
                              f"{costs.without_chain:.2f} without a lookup chain, {costs.with_chain:.2f} with one")
        if estimated:
            entry.info["gate"] += (f" (a situation the calibration prompts never met takes the profile's estimate: "
                                   f"{estimated[0].without_chain:.2f}, {estimated[0].with_chain:.2f})")
        print(f"draftheads eval: {entry.name}: {entry.info['gate']}", flush=True)


def profile_entry(model, tokenizer, entry: Entry, calibration, settings: EvalSettings):
    """The drafter's cached cost profile (draft time per level and per node), timed on the first calibration prompt."""
    prompt = torch.tensor(first_chat(tokenizer, calibration[0], settings).input_ids, device=model.device)
    folder = entry.info.get("folder")
    key = {"drafter": entry.name, "kind": entry.kind, "folder": folder_fingerprint(Path(folder)) if folder else None,
           "lookup_depth": getattr(entry.drafter, "lookup_depth", None)}
    return drafter_profile(model, entry.drafter, prompt=prompt, name=entry.name, key=key, draft_limit=entry.draft_limit,
                           progress=lambda line: print(line, flush=True))


# ---------------------------------------------------------------- predictions


@dataclass
class Forecast:
    """What the cost model needs for one drafter x rule besides a step's shape: the machine's profile, the rule's
    cost names, the drafter's draft time per step, the prompts' lengths and the tokens expected per prompt."""

    profile: object
    setting: str
    plain_setting: str
    draft_steps: float      # draft time per step / plain decode step, both timed on the calibration prompts
    observe_steps: float    # reading a prompt, per token, in the same unit
    lengths: list[int]
    new_tokens: int
    calibrated: StepShape   # the acceptance the prediction is made from
    source: str             # where that acceptance was measured

    def speedup(self, shape: StepShape) -> dict:
        return predict(self.profile, None, shape, self.lengths, self.new_tokens, self.setting, self.plain_setting,
                       draft_steps=self.draft_steps, observe_steps=self.observe_steps)


def predict_entries(model, tokenizer, entries: list[Entry], configs: list[RunConfig], calibration,
                    settings: EvalSettings, profile, lengths: list[int], earlier: EarlierReport | None = None) -> dict:
    """(drafter, rule, temperature) -> its Forecast, made before the evaluated prompts run: tau, nodes and draft time
    per step from the same drafter, tree and rule on the calibration prompts (tau and nodes from `earlier`, an earlier
    evaluation, where it measured the same drafter, tree, rule and temperature); verify and rule costs from the
    machine's profile."""
    out = {}
    for cfg in configs:
        setting = rule_setting(cfg.rule, cfg.temperature, settings.top_k, settings.top_p)
        plain_setting = rule_setting("strict" if cfg.sampled else "greedy", cfg.temperature, settings.top_k, settings.top_p)
        for entry in entries:
            # a few plain decode steps right before each drafter's runs: their time is the unit of its draft costs
            plain = generate_conversations(model, tokenizer, calibration[:1], None, RunConfig(
                "greedy" if not cfg.sampled else "strict", cfg.plain_key), settings, max_new_tokens=UNIT_TOKENS)[0].stats
            stats = GenerationStats.merged(r.stats for r in generate_conversations(model, tokenizer, calibration, entry,
                                                                                   cfg, settings))
            if stats.steps and plain.steps:
                step = plain.decode_s / plain.steps
                shape, source = StepShape(stats.tau, sum(stats.step_nodes) / stats.steps, entry.depth), "calibration"
                measured = earlier.shape(entry.name, cfg.rule, cfg.temperature, entry.info["tree"], entry.depth) if earlier else None
                if measured:
                    shape, source = measured, "earlier evaluation"
                elif earlier:
                    print(f"draftheads eval: {entry.name} {cfg.rule} T={cfg.temperature:g}: {earlier.describe()} has no row "
                          f"with tree {entry.info['tree']}; predicting from the calibration prompts", flush=True)
                out[(entry.name, cfg.rule, cfg.temperature)] = Forecast(
                    profile, setting, plain_setting, stats.mean_draft_s / step,
                    stats.draft_prefill_s / max(1, stats.prompt_tokens) / step, lengths,
                    round(stats.new_tokens / max(1, len(calibration))), shape, source)
    return out


def prediction_columns(forecast: Forecast | None, row: dict) -> dict:
    """The row's predicted figures and their errors against what was measured: `predicted_*` from the calibration
    prompts' acceptance (made before the run); `cost_model_*` the same cost model given the acceptance this run
    measured (tau and nodes per step, not its timings), which isolates the error of the costs from that of tau."""
    none = {"predicted_speedup": None, "prediction_error": None, "predicted_tau": None, "predicted_from": None, "cost_model_speedup": None,
            "cost_model_error": None}
    if forecast is None or row.get("batch_size", 1) != 1:   # the profile times one sequence
        return none
    before = forecast.speedup(forecast.calibrated)
    given = forecast.speedup(StepShape(row["tau"], row["mean_nodes"], forecast.calibrated.depth))
    measured = row.get("speedup")
    return {"predicted_speedup": before["speedup"], "predicted_tau": before["tau"], "predicted_from": forecast.source,
            "predicted_verify_cost": before["verify_cost"], "predicted_draft_cost": before["draft_cost"],
            "prediction_error": before["speedup"] / measured - 1 if measured else None,
            "cost_model_speedup": given["speedup"], "cost_model_error": given["speedup"] / measured - 1 if measured else None}


# ---------------------------------------------------------------- prompts


def eval_settings(model, tokenizer, entries, max_new_tokens, seed, top_k, top_p, epsilon, delta, extra_nodes=1) -> EvalSettings:
    """Room for the longest conversation: the target's context minus the replies and the biggest draft tree."""
    context = context_limit(model)
    nodes = max([tree_nodes(e) for e in entries] + [extra_nodes])
    max_length = context - nodes - 1
    if max_length <= max_new_tokens + 1:
        raise DraftheadsError(f"max_new_tokens {max_new_tokens} plus a {nodes}-node draft tree do not fit the target's "
                              f"context of {context} tokens; lower max_new_tokens")
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    return EvalSettings(max_new_tokens, max_length, stops, seed, top_k, top_p, epsilon, delta)


def tree_nodes(entry: Entry) -> int:
    tree = entry.tree if entry.tree is not None else entry.drafter.default_tree()
    return tree.num_nodes + (entry.drafter.lookup_depth if entry.kind == "combined" else 0)


def load_conversations(source: str, limit: int | None, tokenizer, settings: EvalSettings, calibration: int = 0):
    """(conversations, skip reasons, calibration conversations): prompts from humaneval / a file / a hub dataset,
    kept when they fit. Calibration (what predictions and automatic trees are fitted on) takes the `calibration`
    prompts after the evaluated ones, or the first evaluated ones when the source has no more."""
    found = collections.Counter()
    prompts = load_source(PromptSource(source=source, limit=None if limit is None else limit + calibration), found)
    conversations, skipped = fitting(prompts[:limit], 0, tokenizer, settings)
    for reason, count in found.items():
        skipped[reason] = skipped.get(reason, 0) + count
    if not conversations:
        raise DraftheadsError(f"no prompt of '{source}' fits the target's context; use shorter prompts or lower max_new_tokens")
    extra = fitting(prompts[limit:], limit, tokenizer, settings)[0][:calibration] if limit is not None else []
    return conversations, skipped, extra or conversations[:calibration]


def fitting(prompts, first_id: int, tokenizer, settings: EvalSettings) -> tuple[list[Conversation], dict]:
    conversations, skipped = [], {}
    for i, prompt in enumerate(prompts, start=first_id):
        conv = Conversation(i, list(prompt.turns), prompt.system, prompt.kind)
        # Room for the first reply; later turns end the conversation early when they no longer fit.
        chat = first_chat(tokenizer, conv, settings)
        if chat.stopped or len(chat.input_ids) + settings.max_new_tokens > settings.max_length:
            reason = chat.stopped or "prompt plus max_new_tokens longer than the target's context"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        conversations.append(conv)
    return conversations, skipped


# ---------------------------------------------------------------- results


def build_rows(found: Measurements, entries: list[Entry], configs: list[RunConfig], conversations,
               batch_size: int = 1) -> list[dict]:
    """One summary row per drafter x config, against the plain runs of the same conversations (at one batch size)."""
    rows = []
    for cfg in configs:
        plain = found.plain[cfg.plain_key]
        for entry in entries:
            spec = found.spec[(entry.name, cfg)]
            row = {"drafter": entry.name, "kind": entry.kind, "rule": cfg.rule, "temperature": cfg.temperature,
                   "tree": entry.info["tree"], "batch_size": batch_size}
            row.update(summarise(GenerationStats.merged(o.stats for o in plain),
                                 GenerationStats.merged(o.stats for o in spec), depth=entry.depth))
            row.update(compare_outputs(plain, spec, cfg, conversations))
            rows.append(row)
    return rows


def compare_outputs(plain: list, spec: list, cfg: RunConfig, conversations) -> dict:
    """Greedy: which prompts' outputs differ from plain decoding. Sampled: mean target log-prob per token."""
    out = {"greedy_mismatches": None, "mismatched_prompts": [], "first_divergence": [], "logprob_spec": None,
           "logprob_plain": None}
    if not cfg.sampled:
        bad = [(c.prompt_id, a.tokens, b.tokens) for c, a, b in zip(conversations, plain, spec) if a.tokens != b.tokens]
        # where the outputs part: late divergences after near-ties are bf16 rounding, early ones a broken loop
        first = [shared_prefix_length(a, b) for _, a, b in bad]
        out.update(greedy_mismatches=len(bad), mismatched_prompts=[i for i, _, _ in bad], first_divergence=first)
    else:
        out["logprob_spec"] = _mean_logprob(spec)
        out["logprob_plain"] = _mean_logprob(plain)
    return out


def _mean_logprob(outputs) -> float | None:
    count = sum(o.logprob_count for o in outputs)
    return sum(o.logprob_sum for o in outputs) / count if count else None


def check_report_folder(out: str | None) -> None:
    """--out must be a new or empty folder, or an earlier report's (whose files are replaced), somewhere writable."""
    if out is None:
        return  # a new timestamped folder
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DraftheadsError(f"--out {out} is a file; give a folder for the report")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "report.json").is_file():
        raise DraftheadsError(f"--out {out} is not empty and holds no earlier report; give a new or empty folder")
    parent = next(p for p in [folder.absolute(), *folder.absolute().parents] if p.exists())
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise DraftheadsError(f"cannot write the report to --out {out}: {parent} is not a writable folder; choose another place")


def report_folder(out: str | None, drafters: list[str]) -> Path:
    """--out, else eval-<timestamp>/ inside the first run folder given, else under runs/."""
    if out:
        return Path(out)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for spec in drafters:
        path = Path(split_spec(spec)[0])
        if path.is_dir() and (path / "final").is_dir():
            return path / f"eval-{stamp}"
    return Path("runs") / f"eval-{stamp}"
