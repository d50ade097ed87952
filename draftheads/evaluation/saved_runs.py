"""What a learned drafter's run left beside it and an evaluation reads back: the recipe it was trained with (its
target, chat-template variables, data.mode and eval: section), and the target loaded as that recipe loaded and
prompted it (the settings its config.json records, so a drafter folder copied without its run keeps them)."""

from __future__ import annotations

import copy
import sys

from draftheads.core.config import build
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import run_recipe
from draftheads.data.hardware import dtype_name, resolve_device
from draftheads.data.target import attach_chat_template, load_target
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.interop.native import (PROVENANCE, read_config, read_export_record, recorded_settings,
                                       resolve_drafter_folder, target_settings, target_summary)
from draftheads.measurement.drafter_specs import learned_paths

# what flags may set (None: not given), and what only the recording sets; the last two only for the target it names
FLAGGED = ("dtype", "device", "chat_template")
RECORDED = ("attn_implementation", "mode")
SAME_TARGET_ONLY = ("revision", "trust_remote_code")


def first_run_recipe(drafters: list[str]) -> dict | None:
    """The recipe saved with the first learned drafter's run (None: prompt lookup only, or a folder without its run)."""
    paths = learned_paths(drafters)
    return run_recipe(resolve_drafter_folder(paths[0])) if paths else None


def saved_eval_settings(drafters: list[str]) -> EvalConfig:
    """The eval: section of the recipe saved with the first learned drafter's run, else EvalConfig's defaults
    (prompt lookup only, a drafter folder without its run, a run whose recipe has no eval section)."""
    saved = first_run_recipe(drafters)
    return build(EvalConfig, saved["eval"], "eval") if saved and saved.get("eval") else EvalConfig()


def saved_target_settings(drafters: list[str]) -> dict:
    """The target settings the first learned drafter was trained with (native.target_settings: target.*, the chat
    template's text, data.chat_template_kwargs and data.mode): its config.json's, else, for a folder saved before
    config.json recorded them, its run's recipe copy's; {} for prompt lookup alone."""
    paths = learned_paths(drafters)
    if not paths:
        return {}
    folder = resolve_drafter_folder(paths[0])
    config = read_config(folder)
    if "settings" in (config.get("target") or {}):
        return recorded_settings(config)
    recipe = run_recipe(folder)
    return target_settings(recipe) if recipe else {}


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


def load_eval_target(spec: str | None, dtype: str | None, drafters: list[str], target_model=None, *,
                     chat_template: str | None = None, device: str | None = None):
    """(model, tokenizer, info): the given pair, or `spec`, or the target the first learned drafter names, loaded
    with `dtype`, `device` and `chat_template` (flags: None where not given) and, for the rest, the settings that
    drafter's target was trained with (saved_target_settings)."""
    check_drafter_records(drafters)
    recorded = saved_target_settings(drafters)
    template_kwargs, mode = recorded.get("chat_template_kwargs") or {}, recorded.get("mode") or "chat"
    template, used = chat_template, []
    if target_model is not None:
        model, tokenizer = target_model
        name = spec or getattr(model, "name_or_path", None) or type(model).__name__
        if not template and mode == "chat" and not getattr(tokenizer, "chat_template", None):
            template = recorded.get("chat_template")
    else:
        name = spec or saved_target_name(drafters) or "smollm2-135m"
        flags = {"dtype": dtype, "device": device, "chat_template": chat_template}
        options, used = load_options(recorded, flags, name == saved_target_name(drafters))
        model, tokenizer = load_target(name, **options)
        template = None   # attached by load_target
    if template_kwargs or mode != "chat" or template:   # prompted as the drafter's data was (a copy: the caller's
        tokenizer = copy.copy(tokenizer)                  # tokenizer stays as it was)
        attach_chat_template(tokenizer, template, str(name), template_kwargs, mode)
    info = {**target_summary(model), "name": str(name), "dtype": dtype_name(model.dtype), "device": str(model.device),
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "chat_template_kwargs": template_kwargs, "data_mode": mode, "recorded_settings_used": used}
    return model, tokenizer, info


def load_options(recorded: dict, flags: dict, same_target: bool) -> tuple[dict, list[str]]:
    """(load_target's keywords, the recorded settings among them): each flag given, else the drafter's recorded
    setting; revision and trust_remote_code only for the target the drafter records (not another --target). The
    recorded settings used are said in one note, trust_remote_code included: it is never turned on silently."""
    options, used = {k: v for k, v in flags.items() if v is not None}, []
    for key in (*FLAGGED, *RECORDED, *(SAME_TARGET_ONLY if same_target else ())):
        if key not in options and recorded.get(key) is not None:
            options[key] = recorded[key]
            used.append(key)
    if "device" in used and not device_here(options["device"]):
        print(f"note: the drafter's target ran on {options['device']}, which this machine lacks; loading it on "
              "'auto' (--device sets one)", file=sys.stderr)
        options["device"] = "auto"
        used.remove("device")
    if used:
        said = ", ".join(key if key == "chat_template" else f"{key}={options[key]}" for key in used)
        print(f"note: loading the target as the drafter's recipe did: {said} (flags --dtype, --device and "
              "--chat-template override)", file=sys.stderr)
    return options, used


def device_here(device: str) -> bool:
    """Whether this machine has `device` (a recorded one may name a GPU the evaluating machine lacks)."""
    try:
        resolve_device(device)
    except DraftheadsError:
        return False
    return True
