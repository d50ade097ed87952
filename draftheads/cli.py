"""`draftheads` command line: data, train, eval, export, demo, recipe.

Every user error is a `DraftheadsError`, printed as one line (`error: ...`) with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from draftheads.errors import DraftheadsError, NotImplementedYet


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args) or 0
    except DraftheadsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume where it stopped", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftheads", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"draftheads {_version()}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    p = sub.add_parser("data", help="generate training data with the target's own responses")
    _recipe_args(p)
    p.add_argument("--overwrite", action="store_true", help="start again, discarding existing data")
    p.add_argument("--dry-run", action="store_true", help="print 3 rendered examples with the loss mask visible")
    p.set_defaults(handler=cmd_data)

    p = sub.add_parser("train", help="train a drafter (same as: accelerate launch -m draftheads.train RECIPE)")
    _recipe_args(p)
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("eval", help="measure acceptance and speedup of drafters")
    p.add_argument("drafters", nargs="*", help="drafter or run folders")
    p.add_argument("--target", default=None, help="target spec (default: the drafter's target)")
    p.add_argument("--prompts", default="humaneval", help="humaneval, a local file, or a hub dataset")
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts")
    p.add_argument("--accept", default="greedy", help="comma-separated: greedy,strict,typical")
    p.add_argument("--temperature", default="0", help="comma-separated temperatures")
    p.add_argument("--tree", default=None, help="chain:K | static:PATHS | auto | dynamic:TOPK,DEPTH,TOTAL")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--out", default=None, help="report folder (default: a timestamped folder)")
    p.set_defaults(handler=cmd_eval)

    p = sub.add_parser("export", help="export a drafter for a serving engine")
    p.add_argument("source", help="run folder or drafter folder")
    p.add_argument("--format", required=True, help="native, or an engine format")
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser("demo", help="data, training and evaluation end to end on the embedded target")
    p.add_argument("--out", default="runs/demo", help="where the demo leaves its artefacts")
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("recipe", help="list or show recipes")
    rsub = p.add_subparsers(title="actions", metavar="ACTION")
    show = rsub.add_parser("show", help="print the fully resolved recipe, with values derived from the target")
    _recipe_args(show)
    show.add_argument("--no-target", action="store_true", help="do not read the target's config (no derived values)")
    show.set_defaults(handler=cmd_recipe_show)
    rsub.add_parser("list", help="list the bundled recipes").set_defaults(handler=cmd_recipe_list)
    return parser


def _recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="bundled recipe name or YAML path")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4 head.num_heads=3")


def _version() -> str:
    from draftheads import __version__

    return __version__



def cmd_recipe_show(args) -> int:
    from draftheads.recipe import load_recipe
    from draftheads.recipe_show import format_recipe
    from draftheads.training.target import load_target_config

    recipe = load_recipe(args.recipe, args.overrides)
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
    raise NotImplementedYet("draftheads data")


def cmd_train(args) -> int:
    raise NotImplementedYet("draftheads train")


def cmd_eval(args) -> int:
    raise NotImplementedYet("draftheads eval")


def cmd_export(args) -> int:
    raise NotImplementedYet("draftheads export")


def cmd_demo(args) -> int:
    raise NotImplementedYet("draftheads demo")


if __name__ == "__main__":
    raise SystemExit(main())
