"""`python -m draftheads.data RECIPE [key=value ...]`, also as `accelerate launch -m draftheads.data RECIPE`
(prompts are split across the processes and the shards merged)."""

from __future__ import annotations

import sys

from draftheads.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    return cli_main(["data", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
