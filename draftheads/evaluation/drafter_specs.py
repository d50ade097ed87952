"""The drafter specs `draftheads eval` takes: a drafter or run folder (a learned drafter); 'lookup' (prompt
lookup, always measured anyway as the no-training baseline); 'FOLDER+lookup' (that drafter combined with prompt
lookup, decoding/combined.py); 'FOLDER+lookup-switch' (the same, verifying the lookup chain alone while the text
is being copied); 'FOLDER+lookup-gate' (the same, drafting the learned tree only while it pays, decoding/gate.py).

    split_spec("runs/eagle+lookup-switch")   # -> ("runs/eagle", "switch")
"""

from __future__ import annotations

LOOKUP_NAMES = ("lookup", "prompt-lookup")
MODE_SUFFIX = {"graft": "+lookup", "switch": "+lookup-switch", "gate": "+lookup-gate"}   # drafter spec / report name


def split_spec(spec: str) -> tuple[str, str | None]:
    """'FOLDER+lookup-switch' -> ('FOLDER', 'switch'); a spec without a lookup suffix -> (spec, None)."""
    for mode, suffix in MODE_SUFFIX.items():
        if spec.endswith(suffix):
            return spec[: -len(suffix)], mode
    return spec, None


def learned_paths(specs: list[str]) -> list[str]:
    """The learned drafters' folders among drafter specs ('FOLDER', 'FOLDER+lookup'; lookup itself left out)."""
    paths = (split_spec(spec)[0] for spec in specs)
    return [path for path in paths if path not in LOOKUP_NAMES]
