"""`draftheads` command line: data, train, eval, drift, update-target, monitor, profile, export, engine (install,
eval), demo, recipe.

Every user error is a `DraftheadsError`, printed as one line (`error: ...`) with exit status 2.
Each command imports the package that does its work when it runs, not before: those pull in torch
and transformers (seconds), which parsing arguments and `--help` never need.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing

from draftheads.core.config import from_text, split_items
from draftheads.core.errors import DraftheadsError
from draftheads.core.version import __version__
# the settings classes whose fields declare the flags that set them: plain Python, no torch (`--help` stays quick)
from draftheads.drift.acceptance_monitor import MonitorConfig, RetrainRule
from draftheads.drift.drift_config import DriftConfig, UpdateConfig
from draftheads.evaluation.eval_config import EngineEvalConfig, EvalConfig
from draftheads.interop.export_config import ExportConfig

# what `draftheads drift` takes of an evaluation's settings (it runs one on each target)
DRIFT_EVAL = ("prompts", "limit", "max_new_tokens", "dtype", "device", "chat_template", "accept", "temperatures",
              "tree")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # overrides may follow options (`data RECIPE --dry-run train.lr=1`): argparse leaves those unparsed
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra and "--engine" in extra and getattr(args, "handler", None) is cmd_eval:
        print("error: --engine is not a flag of draftheads eval; measure drafters inside a serving engine with "
              "draftheads engine eval llama.cpp DRAFTER [--draft-tokens 2,3,4]", file=sys.stderr)
        return 2
    elif extra:   # the sub-command's own usage, not the top-level one
        command = getattr(args, "parser", parser)
        command.print_usage(sys.stderr)
        print(f"error: unrecognized arguments: {' '.join(extra)}; `{command.prog} --help` lists the flags it takes",
              file=sys.stderr)
        return 2
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args) or 0
    except DraftheadsError as e:
        _close_progress_bars()
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _close_progress_bars()
        print("interrupted; run the same command again to resume where it stopped (the last checkpoint or data shard)",
              file=sys.stderr)
        return 130


def _close_progress_bars() -> None:
    """Close every progress bar still drawn, innermost first: a line printed while one is drawn would land on the
    bar's line, and the bar would be redrawn over it. A closed bar leaves the cursor at the start of a line."""
    tqdm = sys.modules.get("tqdm")   # no tqdm imported, no bar drawn (and --help stays light)
    if tqdm is None:
        return
    for bar in sorted(list(tqdm.tqdm._instances), key=lambda bar: -abs(getattr(bar, "pos", 0))):
        bar.close()
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftheads", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"draftheads {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser("data", help="generate training data with the target's own responses")
    _recipe_args(p)
    p.add_argument("--overwrite", action="store_true", help="start again, discarding existing data")
    p.add_argument("--dry-run", action="store_true", help="print 3 rendered examples with the loss mask visible")
    p.set_defaults(handler=cmd_data, parser=p)

    p = sub.add_parser("train", help="train a drafter (same as: accelerate launch -m draftheads.train RECIPE)")
    _recipe_args(p)
    p.set_defaults(handler=cmd_train, parser=p)

    p = sub.add_parser("eval", help="measure acceptance and speedup of drafters in our generation loop",
                       description="Unset flags take the eval: section of the recipe that trained the first drafter, "
                                   "else the defaults shown.")
    p.add_argument("drafters", nargs="*", help="drafter or run folders; 'suffix' for suffix decoding; "
                                               "FOLDER+lookup[-switch|-gate] or FOLDER+suffix[-switch|-gate] for a "
                                               "combination with prompt lookup (always measured) or suffix decoding")
    p.add_argument("--target", default=None, help="target spec (default: the drafter's target)")
    _setting_flags(p, EvalConfig)
    p.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    p.set_defaults(handler=cmd_eval, parser=p)

    p = sub.add_parser("drift", help="what an updated target does to a drafter: how far the target moved, the tau "
                                     "drop predicted from that, and the drafter measured on both targets")
    p.add_argument("drafter", help="the drafter or run folder (optionally +lookup or +suffix)")
    p.add_argument("--target", required=True, help="the updated target (folder, .gguf file or hub id)")
    p.add_argument("--old-target", default=None, help="the target it was trained for (default: its config.json's)")
    p.add_argument("--data", default=None, help="rows the old target wrote, to measure the shift on (default: the "
                                                "drafter's training data)")
    _setting_flags(p, DriftConfig)
    p.add_argument("--old-report", default=None, help="an earlier eval of the drafter on the old target with the same "
                                                      "settings, instead of measuring it again")
    _setting_flags(p, EvalConfig, only=DRIFT_EVAL)   # the same evaluation on both targets
    p.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    p.set_defaults(handler=cmd_drift, parser=p)

    p = sub.add_parser("update-target", help="make an updated target: fine-tuned again on data of its own writing "
                                             "(LoRA or full), or its GGUF requantized")
    p.add_argument("data", nargs="?", help="a `draftheads data` folder the target wrote (not for --requantize)")
    p.add_argument("--out", required=True, help="the updated target's folder (a .gguf file with --requantize)")
    _setting_flags(p, UpdateConfig)
    p.add_argument("--gguf", default=None, choices=["f32", "f16", "bf16", "q8_0"],
                   help="also write the update as a GGUF file of this type in --out, for llama.cpp")
    p.add_argument("--requantize", default=None, choices=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"],
                   help="instead: requantize --base's GGUF (the embedded target's, or a .gguf file) to this type")
    p.set_defaults(handler=cmd_update_target, parser=p)

    p = sub.add_parser("monitor", help="watch a serving engine's draft acceptance (its /metrics) and say when the "
                                       "drafter needs retraining")
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (llama-server started with --metrics, or vLLM)")
    _setting_flags(p, RetrainRule)
    _setting_flags(p, MonitorConfig)
    p.set_defaults(handler=cmd_monitor, parser=p)

    p = sub.add_parser("profile", help="time the target's verify forwards and the drafters' costs on this machine")
    p.add_argument("target", help="target spec, e.g. smollm2-135m or a Hugging Face id or folder")
    p.add_argument("drafters", nargs="*", help="drafter or run folders to time with it")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--refresh", action="store_true", help="measure again instead of reading the cached profile")
    p.add_argument("--out", default=None, help="folder for profile.json and profile.png (default: runs/profile-TIME)")
    p.set_defaults(handler=cmd_profile, parser=p)

    p = sub.add_parser("shipped", help="write the drafter a target ships (the MTP layers of DeepSeek-V3, GLM-4.5, "
                                       "Qwen3-Next, Qwen3.5; Gemma 4's assistant) as a drafter folder: eval's "
                                       "baseline, a fine-tune's start")
    p.add_argument("target", help="the target: a checkpoint folder or Hugging Face id")
    p.add_argument("--out", required=True, help="the drafter folder to write")
    p.add_argument("--depth", type=int, default=3, help="draft steps (past the shipped modules, steps rerun them)")
    p.add_argument("--assistant", default=None, help="a Gemma 4 target's assistant folder or hub id (e.g. "
                                                     "google/gemma-4-e2b-it-assistant)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.set_defaults(handler=cmd_shipped, parser=p)

    p = sub.add_parser("export", help="export a drafter for a serving engine")
    p.add_argument("source", help="run folder or drafter folder")
    p.add_argument("--format", required=True, help="native, or an engine format")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--target", default=None, help="target folder or spec, for formats that need its config")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export of the same format in --out")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                   help="cast the weights (default: as saved, fp32 master weights)")
    _setting_flags(p, ExportConfig)
    p.set_defaults(handler=cmd_export, parser=p)

    p = sub.add_parser("engine", help="build a serving engine that runs on this machine (llama.cpp), and measure "
                                      "drafters in it")
    esub = p.add_subparsers(title="actions", metavar="ACTION")
    install = esub.add_parser("install", help="build llama.cpp from the llama-cpp-python source on PyPI, once (cached)")
    install.add_argument("engine", choices=["llama.cpp"], help="the engine to build")
    install.set_defaults(handler=cmd_engine_install, parser=install)
    engine_eval = esub.add_parser("eval", help="measure EAGLE-3, DFlash, DSpark and native MTP drafters inside the "
                                               "engine, beside its plain and n-gram decoding (greedy), and our own "
                                               "loop's tau on the same prompts")
    engine_eval.add_argument("engine", choices=["llama.cpp"], help="the engine (built once from PyPI's source)")
    engine_eval.add_argument("drafters", nargs="+", help="EAGLE-3, DFlash, DSpark or native MTP drafter or run "
                                                         "folders")
    engine_eval.add_argument("--target", default=None, help="the target's GGUF (default: the drafter's target)")
    _setting_flags(engine_eval, EngineEvalConfig)
    engine_eval.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    engine_eval.set_defaults(handler=cmd_engine_eval, parser=engine_eval)

    p = sub.add_parser("demo", help="data, training and evaluation end to end on the embedded target")
    p.add_argument("--out", default="runs/demo", help="where the demo leaves its artefacts")
    p.add_argument("--heads", default="eagle", help="drafters to train: comma-separated eagle,medusa,mtp")
    p.set_defaults(handler=cmd_demo, parser=p)

    p = sub.add_parser("recipe", help="list or show recipes")
    rsub = p.add_subparsers(title="actions", metavar="ACTION")
    show = rsub.add_parser("show", help="print the fully resolved recipe, with values derived from the target")
    _recipe_args(show)
    show.add_argument("--no-target", action="store_true", help="do not read the target's config (no derived values)")
    show.set_defaults(handler=cmd_recipe_show, parser=show)
    listing = rsub.add_parser("list", help="list the bundled recipes")
    listing.set_defaults(handler=cmd_recipe_list, parser=listing)
    return parser


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", help="bundled recipe name or YAML path")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4 head.num_heads=3")
    p.add_argument("--config", default=None, metavar="FILE", help="the recipe, as a flag (instead of RECIPE)")


def _setting_flags(parser: argparse.ArgumentParser, config_class, only: tuple[str, ...] | None = None) -> None:
    """A flag for each setting of `config_class` that one sets (the field's metadata names it), or for those in
    `only`: its help, choices and metavar read from the field, the one place the setting is declared. No default or
    type of its own: an unset flag leaves the setting to the recipe or the class, and `_flag_values` reads a given
    one as the setting's type, for the class to check."""
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        flag = f.metadata.get("flag")
        if flag and (only is None or f.name in only):
            parser.add_argument(flag, dest=f.name, default=None, help=_flag_help(f, hints[f.name]),
                                **_flag_form(f, hints[f.name]))


def _flag_form(f: dataclasses.Field, hint) -> dict:
    """How argparse takes the flag: a switch for a true/false setting (it sets the other value than the default),
    the options a Literal type or the field's `choices` list, a metavar saying a list is comma-separated, and the
    value of a flag given alone (`bare`)."""
    meta = f.metadata
    if hint is bool:
        return {"action": "store_const", "const": not f.default}
    form = {"required": True} if meta.get("required") else {}
    if "bare" in meta:
        form.update(nargs="?", const=meta["bare"])
    options = meta.get("choices") or _literal_options(hint)
    if options:
        form["choices"] = list(options)
    metavar = meta.get("metavar")
    if typing.get_origin(hint) is list:
        metavar = metavar or f.name.upper()
        form["metavar"] = f"{metavar}[,{metavar}...]"
    elif metavar:
        form["metavar"] = metavar
    return form


def _literal_options(hint) -> tuple:
    """The values of a Literal type, optional or not; () for any other type."""
    options = ([a for a in typing.get_args(hint) if a is not type(None)]
               if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint])
    return typing.get_args(options[0]) if len(options) == 1 and typing.get_origin(options[0]) is typing.Literal else ()


def _flag_help(f: dataclasses.Field, hint) -> str:
    """The field's doc, with its default (argparse formats help with %, so a % in the doc is doubled)."""
    text = f.metadata["doc"] + (", comma-separated" if typing.get_origin(hint) is list else "")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if hint is bool:
        text = text if default is False else f"turn off: {text}"
    elif "bare" in f.metadata:
        text += f" (given alone: {f.metadata['bare']})"
    elif default is not None and not f.metadata.get("required"):
        text += f" (default: {','.join(map(str, default)) if isinstance(default, list) else default})"
    return text.replace("%", "%%")


def _recipe_name(args) -> str:
    """The recipe given as RECIPE or --config FILE (exactly one of them)."""
    given = args.recipe
    if given is not None and "=" in given and args.config is not None:   # `--config FILE key=value`: an override
        args.overrides, given = [given, *args.overrides], None
    if given is not None and args.config is not None:
        args.parser.error(f"give the recipe once: as RECIPE ({given}) or as --config ({args.config}), not both")
    if given is None and args.config is None:
        args.parser.error("a recipe is needed: RECIPE (a bundled name or YAML path) or --config FILE")
    return given if given is not None else args.config


def cmd_recipe_show(args) -> int:
    from draftheads.data.target import load_target_config
    from draftheads.recipe import load_recipe
    from draftheads.recipe_show import format_recipe

    recipe = load_recipe(_recipe_name(args), args.overrides)
    if not args.no_target:
        t = recipe.target
        recipe.resolve(load_target_config(t.name, t.revision, t.trust_remote_code))
    print(format_recipe(recipe))
    return 0


def cmd_recipe_list(args) -> int:
    from draftheads.recipe import bundled_recipes, read_recipe_text

    for name in bundled_recipes():
        text, _ = read_recipe_text(name)
        summary = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")
        print(f"{name:28s} {summary}")
    return 0


def cmd_data(args) -> int:
    from draftheads.data.datagen import run_data
    from draftheads.recipe import load_recipe

    run_data(load_recipe(_recipe_name(args), args.overrides), overwrite=args.overwrite, dry_run=args.dry_run)
    return 0


def cmd_train(args) -> int:
    """Also the entry point of `python -m draftheads.train` and `accelerate launch -m draftheads.train`."""
    from draftheads.recipe import load_recipe
    from draftheads.training.loop import run_training

    run_training(load_recipe(_recipe_name(args), args.overrides))
    return 0


def cmd_eval(args) -> int:
    from draftheads.evaluation.evaluate import run_eval
    from draftheads.evaluation.saved_runs import saved_eval_settings

    # a preset flag replaces what the recipe's eval section set for the draft; other flags given with it are checked
    config = _with_flags(saved_eval_settings(args.drafters).under_preset(args.preset), EvalConfig, args)
    run_eval(args.drafters, config, target=args.target, out=args.out)
    return 0


def cmd_drift(args) -> int:
    from draftheads.drift.drift import run_drift
    from draftheads.evaluation.saved_runs import saved_eval_settings

    rows = _from_flags(DriftConfig, args).rows
    config = _with_flags(saved_eval_settings([args.drafter]), EvalConfig, args)
    run_drift(args.drafter, args.target, config, old_target=args.old_target, data=args.data, rows=rows,
              out=args.out, old_report=args.old_report)
    return 0


def cmd_update_target(args) -> int:
    from pathlib import Path

    from draftheads.core.targets import ALIASES, embedded_gguf
    from draftheads.drift.target_update import update_target
    from draftheads.interop.gguf_targets import convert_to_gguf, requantize_gguf

    config = _from_flags(UpdateConfig, args)   # every flag checked, --requantize or not
    if args.requantize:
        source = embedded_gguf(config.base) if config.base in ALIASES else Path(config.base)
        if source.suffix != ".gguf" or not source.is_file():
            raise DraftheadsError(f"--requantize needs a GGUF target; give --base a .gguf file or "
                                  f"{', '.join(ALIASES)} (got '{config.base}')")
        out = requantize_gguf(source, Path(args.out), args.requantize)
        print(f"draftheads update-target: {source.name} requantized to {args.requantize}: {out}")
        return 0
    if not args.data:
        args.parser.error("give the DATA folder to fine-tune on (or --requantize TYPE)")
    folder = update_target(args.data, args.out, config)
    if args.gguf:
        gguf = convert_to_gguf(folder, folder / f"model-{args.gguf}.gguf", args.gguf)
        print(f"draftheads update-target: as GGUF for llama.cpp: {gguf}")
    return 0


def cmd_monitor(args) -> int:
    """Exit status 3 when the rule fired: a script or a scheduler can start the retraining on it."""
    from draftheads.drift.acceptance_monitor import watch

    rule = _from_flags(RetrainRule, args)
    polling = _from_flags(MonitorConfig, args)
    monitor = watch(args.url, rule, interval_s=polling.interval, polls=polling.polls, stop_when_fired=True)
    if monitor.fired_at is not None:
        print(f"draftheads monitor: retrain: acceptance fell below {rule.threshold:.3f} (poll {monitor.fired_at})")
        return 3
    return 0


def cmd_engine_eval(args) -> int:
    from draftheads.evaluation.engine_eval import run_engine_eval
    from draftheads.evaluation.saved_runs import saved_eval_settings

    saved = saved_eval_settings(args.drafters)   # its prompts and target settings, as our own loop would take them
    base = EngineEvalConfig(prompts=saved.prompts, limit=saved.limit, max_new_tokens=saved.max_new_tokens,
                            dtype=saved.dtype, device=saved.device, chat_template=saved.chat_template)
    run_engine_eval(args.drafters, _with_flags(base, EngineEvalConfig, args), engine=args.engine, target=args.target,
                    out=args.out)
    return 0


def _with_flags(base, config_class, args):
    """`base` with the settings given as flags, checked by the config class, the one place its values are checked."""
    return dataclasses.replace(base, **_flag_values(config_class, args))


def _from_flags(config_class, args):
    """`config_class` built from the settings given as flags (its defaults for the rest), checked by itself."""
    return config_class(**_flag_values(config_class, args))


def _flag_values(config_class, args) -> dict:
    """Setting name -> the value of its flag (the field's metadata names it), for the flags given: each flag's text
    typed as the setting is (comma-separated for lists), as a recipe value would be."""
    hints = typing.get_type_hints(config_class)
    given = {}
    for f in dataclasses.fields(config_class):
        flag, value = f.metadata.get("flag"), getattr(args, f.name, None)
        if flag and value is not None:
            given[f.name] = from_text(value, hints[f.name], flag)
    return given


def cmd_profile(args) -> int:
    from draftheads.evaluation.profile_report import run_profile

    run_profile(args.target, args.drafters, dtype=args.dtype, refresh=args.refresh, out=args.out)
    return 0


def cmd_export(args) -> int:
    from draftheads.interop.export import export_drafter

    settings = _from_flags(ExportConfig, args)
    folder = export_drafter(args.source, args.format, args.out, target=args.target, overwrite=args.overwrite,
                            dtype=args.dtype, speculative_tokens=settings.speculative_tokens,
                            eval_report=settings.eval_report, push_to_hub=settings.push_to_hub,
                            private=settings.private)
    print(f"exported {args.source} as {args.format} to {folder}")
    return 0


def cmd_shipped(args) -> int:
    from draftheads.interop.shipped_mtp import save_shipped

    folder = save_shipped(args.target, args.out, depth=args.depth, dtype=args.dtype, assistant=args.assistant)
    print(f"wrote the drafter {args.target} ships to {folder}")
    return 0


def cmd_engine_install(args) -> int:
    from draftheads.interop.llama_cpp_build import install_llama_cpp

    engine = install_llama_cpp()
    record = engine.record
    print(f"llama.cpp from {record['sdist']}: {engine.server} (built in {record['build_seconds'] / 60:.1f} min on "
          f"{record['jobs']} cores, {record['built']})")
    return 0


def cmd_demo(args) -> int:
    from draftheads.demo import run_demo

    run_demo(args.out, heads=split_items(args.heads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
