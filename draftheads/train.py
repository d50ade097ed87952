"""`python -m draftheads.train RECIPE [key=value ...]`, also as `accelerate launch -m draftheads.train RECIPE`.

The same code as `draftheads train`: load the recipe with its overrides, run the training loop.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftheads.train", description=__doc__.splitlines()[0])
    parser.add_argument("recipe", help="bundled recipe name or YAML path")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-4 train.max_steps=200")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from draftheads.errors import DraftheadsError

    try:
        from draftheads.recipe import load_recipe
        from draftheads.training.loop import run_training

        run_training(load_recipe(args.recipe, args.overrides))
    except DraftheadsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume from the last checkpoint", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
