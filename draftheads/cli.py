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
import typing

import yaml

from draftheads.core.config import convert, load_yaml
from draftheads.core.errors import DraftheadsError
from draftheads.core.version import __version__
from draftheads.evaluation.presets import PRESETS


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

    p = sub.add_parser("eval", help="measure acceptance and speedup of drafters in our generation loop")
    p.add_argument("drafters", nargs="*", help="drafter or run folders; 'suffix' for suffix decoding; "
                                               "FOLDER+lookup[-switch|-gate] or FOLDER+suffix[-switch|-gate] for a "
                                               "combination with prompt lookup (always measured) or suffix decoding")
    p.add_argument("--target", default=None, help="target spec (default: the drafter's target)")
    # unset flags take the eval: section of the recipe that trained the first drafter, else its defaults
    _prompt_args(p)
    p.add_argument("--accept", default=None, metavar="RULE[,RULE...]",
                   help="comma-separated: greedy,strict,typical (default: greedy)")
    p.add_argument("--temperature", dest="temperatures", default=None, metavar="T[,T...]",
                   help="comma-separated temperatures (default: 0)")
    p.add_argument("--tree", default=None, help="chain:K | static:PATHS | dynamic:TOPK,DEPTH,TOTAL | auto[:NODES] "
                                                "(fastest on this machine) | auto:tau[:NODES] "
                                                "(most tokens per forward)")
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="the field's reporting settings: "
                        + ", ".join(f"{name} ({preset.tree})" for name, preset in PRESETS.items())
                        + "; greedy, temperature 0, batch 1")
    p.add_argument("--combined", nargs="?", const="graft", default=None, choices=["graft", "switch", "gate", "all"],
                   help="also measure each learned drafter combined with prompt lookup: graft (the default: the lookup "
                        "chain grafted onto the learned tree), switch (the lookup chain alone while the text is being "
                        "copied, the grafted tree otherwise), gate (the learned tree drafted only while the tokens it "
                        "adds pay for its cost on this machine), all (the three)")
    p.add_argument("--batch-size", dest="batch_sizes", default=None, metavar="B[,B...]",
                   help="comma-separated batch sizes, e.g. 1,2,4,8,16: the speedup-vs-batch curve (default: 1)")
    p.add_argument("--plain-above", default=None, help="decode plainly while more than this many rows are generating")
    p.add_argument("--refresh-profile", action="store_const", const=True, default=None,
                   help="time the target on this machine again instead of reading the cached cost profile")
    p.add_argument("--calibration-prompts", default=None, metavar="N",
                   help="prompts past the evaluated ones that trees, gates and the prediction are fitted on "
                        "(default: 16); more narrow the predicted range, each costs a generation per configuration")
    p.add_argument("--tau-from", default=None, metavar="REPORT",
                   help="predict from the tau an earlier eval measured (its folder or report.json) where it ran the "
                        "same drafter, tree and rule, instead of from the calibration prompts")
    p.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    p.set_defaults(handler=cmd_eval, parser=p)

    p = sub.add_parser("drift", help="what an updated target does to a drafter: how far the target moved, the tau "
                                     "drop predicted from that, and the drafter measured on both targets")
    p.add_argument("drafter", help="the drafter or run folder (optionally +lookup or +suffix)")
    p.add_argument("--target", required=True, help="the updated target (folder, .gguf file or hub id)")
    p.add_argument("--old-target", default=None, help="the target it was trained for (default: its config.json's)")
    p.add_argument("--data", default=None, help="rows the old target wrote, to measure the shift on (default: the "
                                                "drafter's training data)")
    p.add_argument("--rows", default=None, help="rows the shift is measured on (default: 64)")
    p.add_argument("--old-report", default=None, help="an earlier eval of the drafter on the old target with the same "
                                                      "settings, instead of measuring it again")
    _prompt_args(p)
    p.add_argument("--accept", default=None, metavar="RULE[,RULE...]", help="greedy,strict,typical (default: greedy)")
    p.add_argument("--temperature", dest="temperatures", default=None, metavar="T[,T...]")
    p.add_argument("--tree", default=None, help="the tree on both targets (default: the drafter's)")
    p.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    p.set_defaults(handler=cmd_drift, parser=p)

    p = sub.add_parser("update-target", help="make an updated target: fine-tuned again on data of its own writing "
                                             "(LoRA or full), or its GGUF requantized")
    p.add_argument("data", nargs="?", help="a `draftheads data` folder the target wrote (not for --requantize)")
    p.add_argument("--out", required=True, help="the updated target's folder (a .gguf file with --requantize)")
    # numbers and defaults are UpdateConfig's, checked there (as every flag that sets a setting)
    p.add_argument("--method", default=None, choices=["lora", "full"], help="(default: lora)")
    p.add_argument("--steps", default=None, help="optimizer steps: the strength of the update (default: 60)")
    p.add_argument("--lr", default=None, help="learning rate (default 2e-4 lora, 2e-5 full)")
    p.add_argument("--rank", default=None, help="LoRA rank (default: 16)")
    p.add_argument("--batch-size", default=None, help="rows per step (default: 8)")
    p.add_argument("--base", default=None, help="the target to update (default: smollm2-135m)")
    p.add_argument("--gguf", default=None, choices=["f32", "f16", "bf16", "q8_0"],
                   help="also write the update as a GGUF file of this type in --out, for llama.cpp")
    p.add_argument("--requantize", default=None, choices=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"],
                   help="instead: requantize --base's GGUF (the embedded target's, or a .gguf file) to this type")
    p.set_defaults(handler=cmd_update_target, parser=p)

    p = sub.add_parser("monitor", help="watch a serving engine's draft acceptance (its /metrics) and say when the "
                                       "drafter needs retraining")
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8080 (llama-server started with --metrics, or vLLM)")
    p.add_argument("--baseline", required=True,
                   help="acceptance rate (accepted / drafted tokens) measured when the drafter was deployed")
    p.add_argument("--tolerance", default=None, help="relative drop that calls for retraining (default: 0.15)")
    p.add_argument("--window", default=None, help="polls the rate is taken over (default: 20)")
    p.add_argument("--interval", default=None, help="seconds between polls (default: 30)")
    p.add_argument("--polls", default=None, help="stop after this many polls (default: never)")
    p.set_defaults(handler=cmd_monitor, parser=p)

    p = sub.add_parser("profile", help="time the target's verify forwards and the drafters' costs on this machine")
    p.add_argument("target", help="target spec, e.g. smollm2-135m or a Hugging Face id or folder")
    p.add_argument("drafters", nargs="*", help="drafter or run folders to time with it")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--refresh", action="store_true", help="measure again instead of reading the cached profile")
    p.add_argument("--out", default=None, help="folder for profile.json and profile.png (default: runs/profile-TIME)")
    p.set_defaults(handler=cmd_profile, parser=p)

    p = sub.add_parser("export", help="export a drafter for a serving engine")
    p.add_argument("source", help="run folder or drafter folder")
    p.add_argument("--format", required=True, help="native, or an engine format")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--target", default=None, help="target folder or spec, for formats that need its config")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export of the same format in --out")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                   help="cast the weights (default: as saved, fp32 master weights)")
    p.add_argument("--speculative-tokens", default=None,
                   help="draft length written where the engine's config takes one (default: the length it was "
                        "trained for)")
    p.set_defaults(handler=cmd_export, parser=p)

    p = sub.add_parser("engine", help="build a serving engine that runs on this machine (llama.cpp), and measure "
                                      "drafters in it")
    esub = p.add_subparsers(title="actions", metavar="ACTION")
    install = esub.add_parser("install", help="build llama.cpp from the llama-cpp-python source on PyPI, once (cached)")
    install.add_argument("engine", choices=["llama.cpp"], help="the engine to build")
    install.set_defaults(handler=cmd_engine_install, parser=install)
    engine_eval = esub.add_parser("eval", help="measure EAGLE-3 drafters inside the engine, beside its plain and "
                                               "n-gram decoding (greedy), and our own loop's tau on the same prompts")
    engine_eval.add_argument("engine", choices=["llama.cpp"], help="the engine (built once from PyPI's source)")
    engine_eval.add_argument("drafters", nargs="+", help="EAGLE-3 drafter or run folders")
    engine_eval.add_argument("--target", default=None, help="the target's GGUF (default: the drafter's target)")
    _prompt_args(engine_eval)
    engine_eval.add_argument("--draft-tokens", default=None, metavar="N[,N...]",
                             help="comma-separated draft lengths (default: 2,3,4,5)")
    engine_eval.add_argument("--draft-p-min", dest="p_mins", default=None, metavar="P[,P...]",
                             help="comma-separated confidence floors: llama.cpp stops a draft at a token the drafter "
                                  "gives less than this probability (default: 0, always the full length)")
    engine_eval.add_argument("--no-ngram", dest="ngram", action="store_const", const=False, default=None,
                             help="skip llama.cpp's n-gram modes")
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


def _prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", default=None, help="humaneval, mt-bench (80 two-turn questions, 8 categories), gsm8k "
                                                   "(1,319 test problems), math-500, tasks (8 task kinds x 10, "
                                                   "multi-turn and passages), long (22 passage prompts of 4 kinds, "
                                                   "120-1,830 tokens), a local file, or a hub dataset (default: "
                                                   "humaneval)")
    p.add_argument("--limit", default=None, help="at most this many prompts (default: 20)")
    p.add_argument("--max-new-tokens", default=None, help="tokens generated per prompt (default: 128)")
    # the target's settings in our loop; unset, they are the ones the drafter was trained with (its config.json)
    p.add_argument("--dtype", default=None, choices=["auto", "bf16", "fp16", "fp32"],
                   help="the target's dtype in our loop (default: the drafter's recipe's, else auto: bf16 where the "
                        "hardware has native bf16)")
    p.add_argument("--device", default=None, help="the target's device: auto, cpu, cuda, cuda:N or mps (default: the "
                                                  "drafter's recipe's where this machine has it, else auto)")
    p.add_argument("--chat-template", default=None, metavar="TEMPLATE_OR_FILE",
                   help="Jinja chat template or .jinja file for a target without one (default: the one the drafter "
                        "was trained with)")


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
    from draftheads.evaluation.eval_config import EvalConfig
    from draftheads.evaluation.evaluate import run_eval
    from draftheads.evaluation.presets import PRESET_ACCEPT, PRESET_BATCH_SIZES, PRESET_TEMPERATURES
    from draftheads.evaluation.saved_runs import saved_eval_settings

    base = saved_eval_settings(args.drafters)
    if args.preset is not None:   # the preset replaces what the recipe's eval section set; flags still conflict
        base = dataclasses.replace(base, tree=None, accept=list(PRESET_ACCEPT), temperatures=list(PRESET_TEMPERATURES),
                                   batch_sizes=list(PRESET_BATCH_SIZES))
    config = _with_flags(base, EvalConfig, args)
    run_eval(args.drafters, config, target=args.target, out=args.out)
    return 0


def cmd_drift(args) -> int:
    from draftheads.drift.drift import DriftConfig, run_drift
    from draftheads.evaluation.eval_config import EvalConfig
    from draftheads.evaluation.saved_runs import saved_eval_settings

    rows = _from_flags(DriftConfig, args).rows
    config = _with_flags(saved_eval_settings([args.drafter]), EvalConfig, args)
    run_drift(args.drafter, args.target, config, old_target=args.old_target, data=args.data, rows=rows,
              out=args.out, old_report=args.old_report)
    return 0


def cmd_update_target(args) -> int:
    from pathlib import Path

    from draftheads.core.targets import ALIASES, embedded_gguf
    from draftheads.drift.target_update import UpdateConfig, update_target
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
    from draftheads.drift.acceptance_monitor import MonitorConfig, RetrainRule, watch

    rule = _from_flags(RetrainRule, args)
    polling = _from_flags(MonitorConfig, args)
    monitor = watch(args.url, rule, interval_s=polling.interval, polls=polling.polls, stop_when_fired=True)
    if monitor.fired_at is not None:
        print(f"draftheads monitor: retrain: acceptance fell below {rule.threshold:.3f} (poll {monitor.fired_at})")
        return 3
    return 0


def cmd_engine_eval(args) -> int:
    from draftheads.evaluation.engine_eval import run_engine_eval
    from draftheads.evaluation.eval_config import EngineEvalConfig
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
            given[f.name] = convert(_typed(value, hints[f.name], flag), hints[f.name], flag)
    return given


def _typed(value, hint, flag: str):
    """A flag's text as YAML reads it (a list from comma-separated items); text stays text where the setting
    takes it."""
    if not isinstance(value, str):
        return value
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return [item if args[0] is str else _yaml(item, flag) for item in _split(value)]
    if typing.get_origin(hint) is typing.Literal:
        return value   # checked against its options, with a suggestion
    options = [a for a in args if a is not type(None)]
    literals = [a for a in options if typing.get_origin(a) is typing.Literal]
    named = {option for literal in literals for option in typing.get_args(literal)}
    # text where the setting takes text, or names one of its options ('auto' of `int | Literal["auto"]`)
    takes_text = hint is str or str in args or value in named or (literals and len(literals) == len(options))
    return value if takes_text else _yaml(value, flag)


def _yaml(text: str, flag: str):
    """Text as YAML reads it (a yes/no read as a boolean noted); what YAML cannot read ('[1') stays text, for the
    setting's type to refuse in one line."""
    try:
        return load_yaml(text, flag)
    except yaml.YAMLError:
        return text


def cmd_profile(args) -> int:
    from draftheads.evaluation.profile_report import run_profile

    run_profile(args.target, args.drafters, dtype=args.dtype, refresh=args.refresh, out=args.out)
    return 0


def cmd_export(args) -> int:
    from draftheads.interop.export import ExportConfig, export_drafter

    settings = _from_flags(ExportConfig, args)
    folder = export_drafter(args.source, args.format, args.out, target=args.target, overwrite=args.overwrite,
                            dtype=args.dtype, speculative_tokens=settings.speculative_tokens)
    print(f"exported {args.source} as {args.format} to {folder}")
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

    run_demo(args.out, heads=_split(args.heads))
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    raise SystemExit(main())
