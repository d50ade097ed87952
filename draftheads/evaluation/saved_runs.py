"""What a learned drafter's run left beside it and an evaluation reads back: the recipe it was trained with (its
target, chat-template variables, data.mode and eval: section), and the target loaded as that recipe prompted it."""

from __future__ import annotations

import copy
from pathlib import Path

from draftheads.core.config import build
from draftheads.core.run_folder import RECIPE_FILE
from draftheads.core.state_files import read_yaml
from draftheads.data.hardware import dtype_name
from draftheads.data.target import attach_chat_template, load_target
from draftheads.evaluation.drafter_specs import learned_paths
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.interop.native import (PROVENANCE, read_config, read_export_record, resolve_drafter_folder,
                                       target_summary)


def run_recipe(folder: Path) -> dict | None:
    """The resolved recipe saved with the run that produced this drafter (newest checkpoint's copy)."""
    run = folder.resolve().parent.parent
    copies = sorted(run.glob(f"step_*/{RECIPE_FILE}"))
    if not copies:
        return None
    return read_yaml(copies[-1], "run recipe copy", f"copy {RECIPE_FILE} over it from another checkpoint of the run "
                     "(or from the recipe it was trained with), or train again")


def first_run_recipe(drafters: list[str]) -> dict | None:
    """The recipe saved with the first learned drafter's run (None: prompt lookup only, or a folder without its run)."""
    paths = learned_paths(drafters)
    return run_recipe(resolve_drafter_folder(paths[0])) if paths else None


def saved_eval_settings(drafters: list[str]) -> EvalConfig:
    """The eval: section of the recipe saved with the first learned drafter's run, else EvalConfig's defaults
    (prompt lookup only, a drafter folder without its run, a run whose recipe has no eval section)."""
    saved = first_run_recipe(drafters)
    return build(EvalConfig, saved["eval"], "eval") if saved and saved.get("eval") else EvalConfig()


def saved_template_kwargs(drafters: list[str]) -> dict:
    """data.chat_template_kwargs of the recipe the first learned drafter was trained with ({} when none)."""
    return dict(((first_run_recipe(drafters) or {}).get("data") or {}).get("chat_template_kwargs") or {})


def saved_data_mode(drafters: list[str]) -> str:
    """data.mode of the recipe the first learned drafter was trained with: 'completion' for a base model prompted
    with raw text, else 'chat' (the default, and runs from before data.mode existed)."""
    return ((first_run_recipe(drafters) or {}).get("data") or {}).get("mode") or "chat"


def saved_target_name(drafters: list[str]) -> str | None:
    """The target a learned drafter was trained for, from its config.json."""
    for path in learned_paths(drafters):
        saved = read_config(resolve_drafter_folder(path)).get("target") or {}
        if saved.get("name"):
            return saved["name"]
    return None


def check_drafter_records(drafters: list[str]) -> None:
    """Each learned drafter's config.json and, in an engine export, its export record: read now, so a damaged one is
    refused before minutes of loading a target rather than after."""
    for path in learned_paths(drafters):
        folder = resolve_drafter_folder(path)
        read_config(folder)
        if (folder / PROVENANCE).exists():
            read_export_record(folder)


def load_eval_target(spec: str | None, dtype: str, drafters: list[str], target_model=None):
    """(model, tokenizer, info): the given pair, or `spec`, or the target the first learned drafter names."""
    check_drafter_records(drafters)
    template_kwargs, mode = saved_template_kwargs(drafters), saved_data_mode(drafters)
    if target_model is not None:
        model, tokenizer = target_model
        name = spec or getattr(model, "name_or_path", None) or type(model).__name__
    else:
        name = spec or saved_target_name(drafters) or "smollm2-135m"
        model, tokenizer = load_target(name, dtype=dtype, mode=mode)
    if template_kwargs or mode != "chat":   # prompted as the drafter's data was (a copy: the caller's tokenizer stays)
        tokenizer = copy.copy(tokenizer)
        attach_chat_template(tokenizer, None, str(name), template_kwargs, mode)
    info = {**target_summary(model), "name": str(name), "dtype": dtype_name(model.dtype), "device": str(model.device),
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "chat_template_kwargs": template_kwargs, "data_mode": mode}
    return model, tokenizer, info
