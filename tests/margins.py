"""Thresholds on what training produced (accuracy, tau, loss), each with the margin it was derived with.

Float accumulation order differs between CPUs (oneDNN and ATen pick other kernels on AMX, AVX-512, AVX2 and plain
builds), and a few optimiser steps amplify it. A test that trains and then asserts a figure states the bound and why
it holds on any x86-64 CPU: the worst value measured under native, ATEN_CPU_CAPABILITY=avx2 and =default (and other
seeds where the claim allows), and the room left between that and the bound.

With DRAFTHEADS_MARGINS=FILE set, every check appends one JSON line (test, figure, value, bound) to FILE, so a run
under each kernel choice gives the table of margins actually met.
"""

from __future__ import annotations

import json
import os


def at_least(value: float, bound: float, figure: str) -> None:
    """assert value >= bound (the bound's derivation is written beside the call)."""
    _record(figure, float(value), bound, ">=")
    assert value >= bound, f"{figure}: {value} < {bound}"


def at_most(value: float, bound: float, figure: str) -> None:
    """assert value <= bound."""
    _record(figure, float(value), bound, "<=")
    assert value <= bound, f"{figure}: {value} > {bound}"


def _record(figure: str, value: float, bound: float, sense: str) -> None:
    path = os.environ.get("DRAFTHEADS_MARGINS")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
    line = {"test": test, "figure": figure, "value": value, "bound": bound, "sense": sense,
            "isa": os.environ.get("ATEN_CPU_CAPABILITY", "native"), "threads": os.environ.get("OMP_NUM_THREADS")}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
