"""Many `draftheads` command lines, each in a process of its own forked from one that imported draftheads once.

    python -m tests.forked_cli CASES.json    # [{"args", "cwd", "env", "out"}, ...]; writes out/{stdout,stderr,rc}

Starting `python -m draftheads` imports torch and transformers: 5-8 s on a busy 2-core machine, so a hundred
damaged-file cases would spend most of their time importing. Each case here is a fresh process all the same (its own
exit status, stdout, stderr, environment and working folder) forked from this one after those imports, running the
entry point `python -m draftheads` runs, `draftheads.cli.main`, with an uncaught exception printed as Python prints
it. Two run at a time (the machine has two cores). tests/test_damaged_state.py checks a few against real
`python -m draftheads` runs.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

# what the commands import when they run (draftheads/cli.py imports them lazily), imported once here
PRELOAD = ("draftheads.cli", "draftheads.recipe", "draftheads.training.loop", "draftheads.drift.target_update",
           "draftheads.data.datagen", "draftheads.evaluation.evaluate", "draftheads.drift.drift",
           "draftheads.interop.export")
TIMEOUT_S = 240


def run_case(case: dict) -> None:
    """In the forked child: become the case's `draftheads ARGS` process; never returns."""
    code = 1
    try:
        signal.alarm(TIMEOUT_S)   # a hung case dies of SIGALRM instead of hanging the test
        out = Path(case["out"])
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.chdir(case["cwd"])
        os.environ.update(case["env"])
        sys.argv = ["draftheads", *case["args"]]
        from draftheads.cli import main

        code = main(case["args"])
    except SystemExit as e:   # argparse's usage errors, as `python -m draftheads` would exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def status(wait_status: int) -> int:
    """The exit status as subprocess reports it (negative: killed by that signal)."""
    return os.waitstatus_to_exitcode(wait_status)


def run_all(cases: list[dict], parallel: int = 2) -> None:
    running: dict[int, dict] = {}
    pending = list(cases)
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            Path(case["out"]).mkdir(parents=True, exist_ok=True)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                run_case(case)
            running[pid] = case
        pid, wait_status = os.wait()
        done = running.pop(pid)
        (Path(done["out"]) / "rc").write_text(str(status(wait_status)))


def main() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    run_all(json.loads(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    main()
