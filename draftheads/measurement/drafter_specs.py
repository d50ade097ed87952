"""The drafter specs `draftheads eval` takes: a drafter or run folder (a learned drafter); 'lookup' (prompt
lookup, always measured anyway as the no-training baseline); 'suffix' (suffix decoding, decoding/suffix.py);
'FOLDER+lookup' (that drafter combined with prompt lookup, decoding/combined.py); 'FOLDER+lookup-switch' (the
same, verifying the lookup chain alone while the text is being copied); 'FOLDER+lookup-gate' (the same, drafting
the learned tree only while it pays, decoding/gate.py); and the three again with suffix decoding in place of
prompt lookup ('FOLDER+suffix', '+suffix-switch', '+suffix-gate'), which measures suffix decoding alone too.

    split_spec("runs/eagle+lookup-switch")   # -> ("runs/eagle", "lookup", "switch")
    split_spec("runs/eagle+suffix")          # -> ("runs/eagle", "suffix", "graft")
"""

from __future__ import annotations

LOOKUP_NAMES = ("lookup", "prompt-lookup")
SUFFIX_NAMES = ("suffix", "suffix-decoding")
COPIERS = ("lookup", "suffix")   # the model-free drafters a learned one is combined with
MODE_ENDINGS = {"graft": "", "switch": "-switch", "gate": "-gate"}


def combination_name(learned: str, copier: str, mode: str) -> str:
    """The drafter spec / report name of `learned` combined with `copier` in `mode`: 'eagle+lookup-switch'."""
    return learned + combination_ending(copier, mode)


def combination_ending(copier: str, mode: str) -> str:
    return f"+{copier}{MODE_ENDINGS[mode]}"


def split_spec(spec: str) -> tuple[str, str | None, str | None]:
    """'FOLDER+lookup-switch' -> ('FOLDER', 'lookup', 'switch'); a spec without a combination -> (spec, None, None)."""
    for copier in COPIERS:
        for mode in MODE_ENDINGS:
            if spec.endswith(ending := combination_ending(copier, mode)):
                return spec[: -len(ending)], copier, mode
    return spec, None, None


def model_free(path: str) -> bool:
    """Whether a spec's drafter part names prompt lookup or suffix decoding rather than a folder."""
    return path in LOOKUP_NAMES + SUFFIX_NAMES


def learned_paths(specs: list[str]) -> list[str]:
    """The learned drafters' folders among drafter specs ('FOLDER', 'FOLDER+lookup'; lookup and suffix left out)."""
    paths = (split_spec(spec)[0] for spec in specs)
    return [path for path in paths if not model_free(path)]
