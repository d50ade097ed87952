"""How one generation samples and stops: `DecodeSettings`, built and checked once, here.

    settings = DecodeSettings(rule="strict", temperature=0.7, max_new_tokens=64)
    result = generate(target, drafter, input_ids, settings)          # decoding/generate.py

Its defaults are the package's decode defaults, written nowhere else: `speculative_generate`'s keywords,
`draftheads eval`'s settings (evaluation/eval_config.py) and the acceptance rules' thresholds (accept.py) read them
from this class, and `draftheads eval` checks its sampling settings with the functions below. Plain Python, no torch:
the command line builds its flags from settings classes that import this module, and `--help` loads nothing heavy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from draftheads.core.config import doc, suggest
from draftheads.core.errors import DraftheadsError

RULE_NAMES = ("greedy", "strict", "typical")   # the acceptance rules, each run by decoding/accept.RULES


def check_rule(rule: str, setting: str | None = None) -> str:
    """`rule` if it names an acceptance rule, else a one-line error naming them (`setting`: e.g. 'eval.accept')."""
    if rule not in RULE_NAMES:
        what = f"{setting}: unknown acceptance rule" if setting else "unknown acceptance rule"
        raise DraftheadsError(f"{what} '{rule}'{suggest(str(rule), RULE_NAMES)}; use {', '.join(RULE_NAMES)}")
    return rule


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Temperature, top-k and top-p as plain sampling takes them."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise DraftheadsError(f"temperature {temperature!r} is not a finite number >= 0; give e.g. 0 (greedy) or 0.7")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise DraftheadsError(f"top_k {top_k!r} is not a whole number >= 0; give 0 (off) or e.g. 50")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise DraftheadsError(f"top_p {top_p!r} is not in (0, 1]; give 1 (off) or e.g. 0.9")


def check_typical(epsilon: float, delta: float, prefix: str = "") -> None:
    """Typical acceptance's thresholds: at 1 or above nothing but a certain token could be accepted. `prefix` names
    where the settings came from (e.g. 'eval.')."""
    for name, value in (("typical_epsilon", epsilon), ("typical_delta", delta)):
        if not 0 < value < 1:
            raise DraftheadsError(f"{prefix}{name} must be in (0, 1), got {value}; the default is "
                                  f"{getattr(DecodeSettings, name)}")


def check_new_tokens(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise DraftheadsError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")


def applied_rule(rule: str, temperature: float) -> str:
    """The rule a generation runs: `rule`, or greedy at temperature 0.

    At T = 0 the warped target is a one-hot on its argmax, so strict and typical acceptance accept exactly the
    drafts greedy acceptance does and emit its argmax: the greedy rule gives the same tokens and skips warping
    [nodes, V] and the rule's per-node work, several times cheaper. The cost model prices T = 0 runs as greedy too
    (costmodel/profile.rule_setting)."""
    return "greedy" if temperature == 0 else rule


@dataclass(frozen=True)
class DecodeSettings:
    """One generation's acceptance rule, sampling warp, length and stop tokens, checked when built.

    `rule` stays the rule asked for (what a report shows); `applied_rule` is the one the loop runs: greedy at
    temperature 0, which changes no token (see `applied_rule`). It is said here, not in a note per generation:
    an evaluation runs thousands of them, and there is nothing for a user to change.
    """

    rule: str = doc("greedy", "acceptance rule: greedy, strict (lossless sampling) or typical (Medusa's typical "
                              "acceptance, not lossless)")
    temperature: float = doc(0.0, "the target's sampling temperature (0: its argmax, whatever the rule)")
    top_k: int = doc(0, "sample from the target's k most likely tokens (0: all)")
    top_p: float = doc(1.0, "sample from the smallest set of the target's tokens holding this probability (1: all)")
    max_new_tokens: int = doc(128, "tokens generated per prompt")
    typical_epsilon: float = doc(0.09, "typical acceptance: hard threshold epsilon")
    typical_delta: float = doc(0.3, "typical acceptance: entropy-scaled threshold delta")
    eos_token_id: tuple[int, ...] | None = doc(None, "the ids that end a generation, one or several (None: the "
                                                     "target's generation_config, else its config; []: never stop "
                                                     "early)")

    def __post_init__(self):
        check_rule(self.rule)
        check_sampling(self.temperature, self.top_k, self.top_p)
        check_new_tokens(self.max_new_tokens)
        check_typical(self.typical_epsilon, self.typical_delta)
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("typical_epsilon", float),
                           ("typical_delta", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))   # numpy or int values as the loop compares them
        eos = self.eos_token_id
        if eos is not None:
            ids = (eos,) if isinstance(eos, int) else eos
            object.__setattr__(self, "eos_token_id", tuple(int(i) for i in ids))

    @property
    def applied_rule(self) -> str:
        """The rule the loop runs: `rule`, or greedy at temperature 0 (see `applied_rule`)."""
        return applied_rule(self.rule, self.temperature)


def eos_ids(target, eos_token_id) -> frozenset:
    """The ids that end generation: given ones, else the target's generation_config, else its config."""
    if eos_token_id is None:
        generation_config = getattr(target, "generation_config", None)
        eos_token_id = getattr(generation_config, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(target.config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(i) for i in eos_token_id)
