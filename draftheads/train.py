"""`python -m draftheads.train RECIPE [key=value ...]`, also as `accelerate launch -m draftheads.train RECIPE`.

The same entry point as `draftheads train`: load the recipe with its overrides, run the training loop.
"""

from __future__ import annotations

import sys

from draftheads.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
