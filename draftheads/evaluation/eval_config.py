"""The settings of an evaluation, checked once, here, whether they come from a recipe's eval: section, the command
line or the API: `EvalConfig` for `draftheads eval` (our loop), `EngineEvalConfig` for `draftheads engine eval`
(drafters inside a serving engine). The sampling settings take their defaults and docs from DecodeSettings and are
checked by the functions it checks them with (decoding/settings.py); each field with a `flag` is also the command
line's declaration of that flag (cli.py builds it from the field)."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from draftheads.core.config import check, doc, flag_of, same_as
from draftheads.core.tree import parse_tree
from draftheads.decoding.settings import DecodeSettings, check_new_tokens, check_rule, check_sampling, check_typical
from draftheads.evaluation.presets import PRESET_ACCEPT, PRESET_BATCH_SIZES, PRESET_TEMPERATURES, PRESETS

COMBINED_MODES = {"graft": ["graft"], "switch": ["switch"], "gate": ["gate"], "all": ["graft", "switch", "gate"]}
PRESET_FIXES = {"accept": PRESET_ACCEPT, "temperatures": PRESET_TEMPERATURES, "batch_sizes": PRESET_BATCH_SIZES}


def flag(default, text: str, name: str | None = None, **more):
    """A setting with its doc and the command-line flag that sets it (None: a recipe or API setting only); `more`:
    how the CLI shows it (metavar, choices, bare: the value of the flag given alone)."""
    return doc(default, text, flag=name, **more)


def check_prompts(prompts: str, limit: int | None, max_new_tokens: int) -> None:
    check(bool(str(prompts).strip()),
          "eval.prompts (--prompts) is empty; give humaneval, mt-bench, tasks, long, a file or a hub dataset")
    check(limit is None or limit >= 1, f"eval.limit (--limit) must be a whole number >= 1, got {limit}")
    check_new_tokens(max_new_tokens)


def check_device(device: str | None) -> None:
    check(device is None or device == "auto" or device.split(":")[0] in ("cpu", "cuda", "mps"),
          f"eval.device (--device) '{device}' is not a device; use auto, cpu, cuda, cuda:N or mps")


@dataclass
class EvalConfig:
    """Acceptance evaluation (`draftheads eval`). The decode settings are DecodeSettings' (decoding/settings.py: their
    defaults and docs written there); accept and temperatures are lists of its rule and temperature."""

    prompts: str = flag("humaneval", "humaneval, mt-bench (80 two-turn questions, 8 categories), gsm8k (1,319 test "
                                     "problems), math-500, tasks (8 task kinds x 10, multi-turn and passages), long "
                                     "(22 passage prompts of 4 kinds, 120-1,830 tokens), a local file, or a hub "
                                     "dataset", "--prompts")
    limit: int | None = flag(20, "evaluate on at most this many prompts", "--limit")
    preset: str | None = flag(None, "the field's reporting settings: " + ", ".join(
        f"{name} ({preset.tree})" for name, preset in PRESETS.items()) + "; each greedy, temperature 0, batch 1 "
        "(evaluation/presets.py)", "--preset", choices=tuple(PRESETS))
    accept: list[str] = flag([DecodeSettings.rule], "acceptance rules: greedy, strict, typical", "--accept",
                             metavar="RULE")
    temperatures: list[float] = flag([DecodeSettings.temperature], "sampling temperatures", "--temperature",
                                     metavar="T")
    top_k: int = same_as(DecodeSettings, "top_k")
    top_p: float = same_as(DecodeSettings, "top_p")
    tree: str | None = flag(None, "chain:K, static:PATHS, dynamic:TOPK,DEPTH,TOTAL, auto[:NODES] (fastest on this "
                                  "machine) or auto:tau[:NODES] (most tokens per forward) (None: the drafter's)",
                            "--tree")
    max_new_tokens: int = same_as(DecodeSettings, "max_new_tokens", flag="--max-new-tokens")
    typical_epsilon: float = same_as(DecodeSettings, "typical_epsilon")
    typical_delta: float = same_as(DecodeSettings, "typical_delta")
    seed: int = flag(0, "sampling seed (prompt i's turn t is sampled with seed + 1000 i + t)")
    combined: Literal["graft", "switch", "gate", "all"] | None = flag(
        None, "also measure each learned drafter combined with prompt lookup: graft (the lookup chain grafted onto the "
              "learned tree), switch (the lookup chain alone while the text is being copied, the grafted tree "
              "otherwise), gate (the learned tree drafted only while the tokens it adds pay for its cost on this "
              "machine), all (the three)", "--combined", bare="graft")
    batch_sizes: list[int] = flag([1], "decode the prompts in batches of each of these sizes (more than [1]: the "
                                       "speedup-vs-batch curve), e.g. 1,2,4,8,16", "--batch-size", metavar="B")
    plain_above: int | Literal["auto"] | None = flag(
        None, "decode plainly while more than this many rows of a batch are generating; 'auto': as many as the cost "
              "model predicts speculation pays for, per drafter (measured beside always speculating)", "--plain-above")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] | None = flag(
        None, "the target's dtype in our loop (None: the one the drafter's recipe gave, else 'auto': bf16 where the "
              "hardware has native bf16, else fp32; fp32 for a quantized GGUF target)", "--dtype")
    device: str | None = flag(None, "the target's device: auto, cpu, cuda, cuda:N or mps (None: the drafter's "
                                    "recipe's where this machine has it, else auto)", "--device")
    chat_template: str | None = flag(None, "Jinja chat template, or a .jinja file, for the target (None: the one the "
                                           "drafter was trained with, else the tokenizer's)", "--chat-template",
                                     metavar="TEMPLATE_OR_FILE")
    refresh_profile: bool = flag(False, "time the target on this machine again instead of reading the cached cost "
                                        "profile", "--refresh-profile")
    calibration_prompts: int = flag(16, "prompts of the same set, past the evaluated ones, that automatic trees, gates "
                                       "and the prediction are fitted on before the evaluated prompts run; more narrow "
                                       "the predicted range, and each costs one generation per configuration",
                                    "--calibration-prompts", metavar="N")
    tau_from: str | None = flag(None, "predict from the tau an earlier eval measured (its folder or report.json) where "
                                      "it ran the same drafter, tree and rule, instead of from the calibration prompts",
                                "--tau-from", metavar="REPORT")

    def __post_init__(self):
        check(bool(self.accept) and bool(self.temperatures),
              "give at least one acceptance rule (eval.accept, --accept) "
              "and one temperature (eval.temperatures, --temperature)")
        for rule in self.accept:
            check_rule(rule, "eval.accept (--accept)")
        for temperature in self.temperatures:
            check_sampling(temperature, self.top_k, self.top_p)
        check_typical(self.typical_epsilon, self.typical_delta, "eval.")
        check_prompts(self.prompts, self.limit, self.max_new_tokens)
        check_device(self.device)
        check(bool(self.batch_sizes) and all(b >= 1 for b in self.batch_sizes),
              f"eval.batch_sizes (--batch-size) must be whole numbers >= 1, got {self.batch_sizes}; e.g. 1,2,4,8,16")
        check(self.calibration_prompts >= 1, f"eval.calibration_prompts (--calibration-prompts) must be a whole "
                                             f"number >= 1, got {self.calibration_prompts}")
        check(self.plain_above in (None, "auto") or self.plain_above >= 1,
              f"eval.plain_above (--plain-above) must be a whole number >= 1 (decode plainly above that many rows), "
              f"got {self.plain_above}")
        # parsed once, here: a bad or oversized tree is refused before any work, and the run drafts this one
        self.tree_spec = parse_tree(self.tree, "eval.tree (--tree)")
        if self.preset is not None:
            self.apply_preset()

    def apply_preset(self) -> None:
        """Set what the preset fixes; a setting given otherwise is a one-line error, not silently replaced."""
        check(self.preset in PRESETS, f"eval.preset (--preset) '{self.preset}' is not a preset; choose one of "
                                      f"{', '.join(PRESETS)}")
        fixes = {"tree": PRESETS[self.preset].tree, **PRESET_FIXES}
        for name, fixed in fixes.items():
            given = getattr(self, name)
            check(given in (None, fixed), f"eval.preset {self.preset} fixes eval.{name} ({flag_of(EvalConfig, name)}) "
                                          f"to {fixed}, but {given} was given; drop one of the two")
        for name, fixed in fixes.items():
            setattr(self, name, copy.copy(fixed))
        if self.tree_spec is None:   # a tree given with the preset is the preset's, already parsed
            self.tree_spec = parse_tree(self.tree)

    def under_preset(self, preset: str | None) -> EvalConfig:
        """These settings (a recipe's eval: section) as `preset`, given on top of them (a flag), leaves them: what
        the preset fixes is set to its values, and settings given with the preset are checked against it (in
        apply_preset) when they are set; without a preset, unchanged."""
        if preset is None:
            return self
        return dataclasses.replace(self, tree=None, **{name: copy.copy(fixed) for name, fixed in PRESET_FIXES.items()})

    @property
    def decode(self) -> DecodeSettings:
        """The decode settings every run of this evaluation shares (each run sets its rule and temperature)."""
        return DecodeSettings(top_k=self.top_k, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                              typical_epsilon=self.typical_epsilon, typical_delta=self.typical_delta)

    @property
    def combined_modes(self) -> list[str]:
        """The combinations with prompt lookup measured beside each learned drafter."""
        return COMBINED_MODES[self.combined] if self.combined else []


@dataclass
class EngineEvalConfig:
    """Drafters measured inside a serving engine (`draftheads engine eval`), greedy, beside its own decoding."""

    prompts: str = same_as(EvalConfig, "prompts")
    limit: int | None = same_as(EvalConfig, "limit")
    max_new_tokens: int = same_as(EvalConfig, "max_new_tokens")
    draft_tokens: list[int] = flag([2, 3, 4, 5], "draft lengths (llama.cpp's --spec-draft-n-max)", "--draft-tokens",
                                   metavar="N")
    p_mins: list[float] = flag([0.0], "confidence floors: llama.cpp stops a draft at a token the drafter gives less "
                                      "than this probability (0: always the full length)", "--draft-p-min",
                               metavar="P")
    ngram: bool = flag(True, "also run llama.cpp's n-gram modes, alone and beside each drafter", "--no-ngram")
    ours: bool = flag(True, "also run our own loop on the same drafters and prompts, for its tau")
    # our own loop's target: as in draftheads eval
    dtype: Literal["auto", "bf16", "fp16", "fp32"] | None = same_as(EvalConfig, "dtype")
    device: str | None = same_as(EvalConfig, "device")
    chat_template: str | None = same_as(EvalConfig, "chat_template")
    threads: int | None = flag(None, "threads of each llama-server (default: llama.cpp's choice)")

    def __post_init__(self):
        check_prompts(self.prompts, self.limit, self.max_new_tokens)
        check_device(self.device)
        check(bool(self.draft_tokens) and all(n >= 1 for n in self.draft_tokens),
              f"--draft-tokens must be whole numbers >= 1, got {self.draft_tokens}; e.g. 2,3,4")
        check(bool(self.p_mins) and all(math.isfinite(p) and 0 <= p < 1 for p in self.p_mins),
              f"--draft-p-min must be in [0, 1), got {self.p_mins}; e.g. 0,0.5")
        check(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")
