"""Recipes: one YAML file = one runnable job (target, head, data, train, log, eval).

    recipe = load_recipe("eagle-smollm2", ["train.lr=1e-4"])   # bundled name or a path
    recipe.resolve(target.config)                               # derive sizes from the target
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from draftheads.config import build, check, doc, suggest, to_dict
from draftheads.errors import DraftheadsError
from draftheads.heads import HEAD_CONFIGS

DTYPES = ("auto", "bf16", "fp16", "fp32")


@dataclass
class TargetConfig:
    """The frozen target model."""

    name: str = doc("smollm2-135m", "hub id, local folder, .gguf file, or the embedded alias 'smollm2-135m'")
    revision: str | None = doc(None, "hub revision (branch, tag or commit)")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = doc("auto", "'auto': bf16 where the hardware has native bf16, else fp32")
    device: str = doc("auto", "'auto' (cuda if present, else cpu), 'cpu', 'cuda', 'cuda:N' or 'mps'")
    trust_remote_code: bool = doc(False, "allow custom modeling code from the hub (off unless you trust it)")
    chat_template: str | None = doc(None, "Jinja chat template, or a path to a .jinja file, for tokenizers without one")
    attn_implementation: Literal["sdpa", "eager"] = doc("sdpa", "attention kernel of the target")

    def __post_init__(self):
        check(bool(self.name.strip()), "target.name is empty; give a hub id, a local folder, a .gguf file or 'smollm2-135m'")
        check(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
              f"target.device '{self.device}' is not one of auto, cpu, cuda, cuda:N, mps")


@dataclass
class PromptSource:
    """One source of prompts for data generation."""

    source: str = doc("self", "'self' (the target writes prompts), 'humaneval', a hub dataset, or a local json/jsonl/parquet/csv file")
    weight: float = doc(1.0, "relative share of the prompts drawn from this source")
    split: str = doc("train", "dataset split")
    subset: str | None = doc(None, "dataset configuration name")
    format: Literal["auto", "sharegpt", "messages", "turns", "alpaca", "prompt"] = doc("auto", "chat format of the rows")
    columns: dict[str, str] = doc({}, "column renames, e.g. {conversations: dialog}")
    limit: int | None = doc(None, "use at most this many rows of the source")
    temperature: float = doc(1.0, "'self' only: sampling temperature of the prompts the target writes")
    max_tokens: int = doc(128, "'self' only: longest prompt the target writes, in tokens (longer ones are cut back to their "
                                      "last full sentence, or dropped if they have none)")
    starts_with: str = doc("", "'self' only: words every prompt begins with, steering the topic (e.g. 'Write a Python function')")

    def __post_init__(self):
        check(self.weight > 0, f"data.prompts: weight must be positive, got {self.weight}")
        check(self.limit is None or self.limit > 0, f"data.prompts: limit must be positive, got {self.limit}")
        check(self.temperature > 0, f"data.prompts: temperature must be > 0 (greedy would write one prompt over and over), got {self.temperature}")
        check(self.max_tokens > 0, f"data.prompts: max_tokens must be positive, got {self.max_tokens}")
        check(not self.starts_with or self.source == "self", f"data.prompts: starts_with only applies to source 'self', not '{self.source}'")
        check(self.starts_with == self.starts_with.rstrip(), "data.prompts: starts_with must not end with a space (the target writes the next word with its own space)")


@dataclass
class DataConfig:
    """Target-generated training data (`draftheads data`)."""

    prompts: list[PromptSource] = doc([PromptSource()], "prompt sources, mixed by weight")
    output: str | None = doc(None, "dataset folder (default data/<name>)")
    num_prompts: int = doc(400, "total prompts to answer")
    system_prompt: str | None = doc(None, "system prompt for every conversation")
    max_new_tokens: int = doc(256, "longest response per turn")
    max_length: int = doc(1024, "longest prompt+response in tokens")
    truncate: bool = doc(False, "truncate prompts longer than max_length instead of skipping them")
    temperature: float = doc(0.0, "0 = greedy")
    top_p: float = doc(1.0, "nucleus sampling threshold")
    seed: int = doc(0, "sampling and mixing seed")
    batch_size: int = doc(16, "prompts generated together")
    shard_size: int = doc(256, "prompts per saved shard: the unit of resuming after a kill")
    backend: Literal["local", "openai"] = doc("local", "'local': this process runs the target; 'openai': an OpenAI-compatible server")
    openai_url: str | None = doc(None, "base URL of the OpenAI-compatible server, e.g. http://host:8000/v1")
    openai_model: str | None = doc(None, "model name on that server (default target.name)")
    concurrency: int = doc(8, "openai backend: requests in flight")
    max_retries: int = doc(3, "openai backend: retries per request")

    def __post_init__(self):
        check(len(self.prompts) > 0, "data.prompts is empty; add at least one source, e.g. [{source: self}]")
        for name in ("num_prompts", "max_new_tokens", "max_length", "batch_size", "shard_size", "concurrency"):
            check(getattr(self, name) > 0, f"data.{name} must be positive, got {getattr(self, name)}")
        check(self.temperature >= 0, f"data.temperature must be >= 0, got {self.temperature}")
        check(0 < self.top_p <= 1, f"data.top_p must be in (0, 1], got {self.top_p}")
        check(self.max_retries >= 0, "data.max_retries must be >= 0")
        check(self.backend != "openai" or bool(self.openai_url), "data.backend is 'openai' but data.openai_url is not set")


@dataclass
class TrainConfig:
    """The Accelerate training loop (`draftheads train`)."""

    output_dir: str | None = doc(None, "run folder (default runs/<name>)")
    mode: Literal["online", "offline"] = doc("online", "'online': target forward every step; 'offline': features cached to disk once")
    max_steps: int = doc(1000, "optimizer steps")
    time_budget_minutes: float | None = doc(None, "the wall-clock budget this recipe is sized for on its stated hardware")
    batch_size: int = doc(8, "sequences per micro-batch per process")
    grad_accum: int = doc(1, "micro-batches per optimizer step")
    max_length: int = doc(1024, "longest training sequence in tokens")
    bucket_by_length: bool = doc(True, "batch rows of similar length together (less padding); rows never attend to each other")
    lr: float = doc(3e-4, "AdamW learning rate")
    weight_decay: float = doc(0.0, "AdamW weight decay")
    betas: list[float] = doc([0.9, 0.95], "AdamW betas")
    warmup_steps: int = doc(50, "linear warm-up steps")
    schedule: Literal["cosine", "linear", "constant"] = doc("cosine", "learning-rate schedule after warm-up")
    max_grad_norm: float = doc(1.0, "gradient clipping (0 = off)")
    seed: int = doc(0, "seed for weights, data order and noise")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = doc("auto", "'auto': bf16 where the hardware has native bf16, else fp32")
    eval_fraction: float = doc(0.05, "share of rows held out for evaluation")
    eval_every: int = doc(200, "evaluate every N steps")
    save_every: int = doc(500, "checkpoint every N steps")
    keep_last: int = doc(2, "checkpoints kept (the best one is kept too)")
    resume: str = doc("auto", "'auto' (newest complete checkpoint), 'never', or a checkpoint folder")
    log_every: int = doc(10, "log metrics every N steps")
    feature_dtype: Literal["bf16", "fp16", "fp32"] = doc("bf16", "offline mode: dtype of cached features (fp32 doubles the disk size)")
    feature_cache: str | None = doc(None, "offline mode: feature cache folder (default <data folder>/features/<key>)")

    def __post_init__(self):
        check(self.lr > 0, f"train.lr must be positive, got {self.lr}")
        for name in ("max_steps", "batch_size", "grad_accum", "max_length", "eval_every", "save_every", "log_every", "keep_last"):
            check(getattr(self, name) > 0, f"train.{name} must be positive, got {getattr(self, name)}")
        check(self.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        check(self.max_grad_norm >= 0, f"train.max_grad_norm must be >= 0, got {self.max_grad_norm}")
        check(0 <= self.eval_fraction < 1, f"train.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"train.betas must be two numbers in [0, 1), got {self.betas}")
        check(self.time_budget_minutes is None or self.time_budget_minutes > 0, "train.time_budget_minutes must be positive")


TRACKERS = ("wandb", "tensorboard", "trackio")


@dataclass
class LogConfig:
    """Experiment tracking (never requires an account)."""

    trackers: list[str] = doc(["tensorboard"], "any of wandb, tensorboard, trackio")
    project: str = doc("draftheads", "project name in the trackers")
    wandb_mode: Literal["offline", "online"] = doc("offline", "wandb stays offline unless set to online")

    def __post_init__(self):
        for t in self.trackers:
            check(t in TRACKERS, f"log.trackers: unknown tracker '{t}'{suggest(t, TRACKERS)}; use any of {', '.join(TRACKERS)}")


ACCEPT_RULES = ("greedy", "strict", "typical")


@dataclass
class EvalConfig:
    """Acceptance evaluation (`draftheads eval`)."""

    prompts: str = doc("humaneval", "'humaneval', a local file, or a hub dataset")
    limit: int | None = doc(20, "evaluate on at most this many prompts")
    accept: list[str] = doc(["greedy"], "acceptance rules: greedy, strict, typical")
    temperatures: list[float] = doc([0.0], "sampling temperatures")
    tree: str | None = doc(None, "chain:K, dynamic:TOPK,DEPTH,TOTAL, auto, or static:PATHS (default: the drafter's)")
    max_new_tokens: int = doc(128, "tokens generated per prompt")
    typical_epsilon: float = doc(0.09, "typical acceptance: hard threshold epsilon")
    typical_delta: float = doc(0.3, "typical acceptance: entropy-scaled threshold delta")
    seed: int = doc(0, "sampling seed")

    def __post_init__(self):
        for rule in self.accept:
            check(rule in ACCEPT_RULES, f"eval.accept: unknown rule '{rule}'{suggest(rule, ACCEPT_RULES)}; use greedy, strict or typical")
        check(all(t >= 0 for t in self.temperatures), "eval.temperatures must be >= 0")
        check(self.limit is None or self.limit > 0, "eval.limit must be positive")
        check(self.max_new_tokens > 0, "eval.max_new_tokens must be positive")
        check(self.typical_epsilon > 0 and self.typical_delta > 0, "eval.typical_epsilon and eval.typical_delta must be positive")


SECTIONS = {"target": TargetConfig, "data": DataConfig, "train": TrainConfig, "log": LogConfig, "eval": EvalConfig}


@dataclass
class Recipe:
    """A whole job. `derived` holds the values read from the target by `resolve`."""

    name: str
    target: TargetConfig
    head: Any  # MedusaConfig | EagleConfig | MTPConfig
    data: DataConfig
    train: TrainConfig
    log: LogConfig
    eval: EvalConfig
    source: str = ""
    derived: dict = dataclasses.field(default_factory=dict)

    def resolve(self, target_config) -> "Recipe":
        """Derive hidden size, vocabulary and layer count (and head values that follow) from the target."""
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        self.derived = {
            "architecture": (getattr(target_config, "architectures", None) or ["?"])[0],
            "model_type": target_config.model_type,
            "hidden_size": text.hidden_size,
            "vocab_size": text.vocab_size,
            "num_layers": text.num_hidden_layers,
        }
        if hasattr(self.head, "resolve"):
            self.head.resolve(text.num_hidden_layers, text.vocab_size)
        return self

    def to_dict(self) -> dict:
        out = {"name": self.name}
        out.update({s: to_dict(getattr(self, s)) for s in ("target", "head", "data", "train", "log", "eval")})
        if self.derived:
            out["derived"] = dict(self.derived)
        return out

    @property
    def data_dir(self) -> Path:
        return Path(self.data.output or f"data/{self.name}")

    @property
    def run_dir(self) -> Path:
        return Path(self.train.output_dir or f"runs/{self.name}")


def bundled_recipes() -> list[str]:
    """Names of the recipes shipped with the package."""
    folder = importlib.resources.files("draftheads.recipes")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_recipe_text(name_or_path: str) -> tuple[str, str]:
    """(yaml text, where it came from) for a bundled name or a file path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise DraftheadsError(f"recipe file '{name_or_path}' not found; give a YAML path or one of: {', '.join(bundled_recipes())}")
        return path.read_text(), str(path)
    names = bundled_recipes()
    if name_or_path not in names:
        raise DraftheadsError(f"unknown recipe '{name_or_path}'{suggest(name_or_path, names)}; bundled: {', '.join(names)}")
    resource = importlib.resources.files("draftheads.recipes") / f"{name_or_path}.yaml"
    return resource.read_text(), f"bundled:{name_or_path}"


def load_recipe(name_or_path: str, overrides: list[str] = ()) -> Recipe:
    """Load, override (`section.key=value`) and validate a recipe."""
    text, source = read_recipe_text(name_or_path)
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise DraftheadsError(f"recipe {source} is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise DraftheadsError(f"recipe {source} must be a mapping with sections target, head, data, train, log, eval")
    for item in overrides:
        apply_override(data, item)
    return recipe_from_dict(data, source, default_name=Path(source.split(":")[-1]).stem)


def apply_override(data: dict, item: str) -> None:
    """Set `a.b.c=value` in the nested dict; the value is parsed as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise DraftheadsError(f"override '{item}' must look like section.key=value, e.g. train.lr=1e-4")
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise DraftheadsError(f"override '{item}': '{part}' is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        node[parts[-1]] = raw


def recipe_from_dict(data: dict, source: str = "<dict>", default_name: str = "run") -> Recipe:
    allowed = ("name",) + tuple(SECTIONS) + ("head",)
    for key in data:
        if key not in allowed:
            raise DraftheadsError(f"recipe: unknown section '{key}'{suggest(str(key), allowed)}; sections: {', '.join(allowed)}")
    name = data.get("name", default_name)
    check(isinstance(name, str) and name.strip() != "", "recipe: name must be a non-empty string")
    sections = {s: build(cls, data.get(s), s) for s, cls in SECTIONS.items()}
    return Recipe(name=name, head=build_head_config(data.get("head")), source=source, **sections)


def build_head_config(data: Any):
    if not isinstance(data, dict) or "type" not in data:
        raise DraftheadsError(f"head: missing 'type'; use one of {', '.join(HEAD_CONFIGS)}")
    kind = data["type"]
    if kind not in HEAD_CONFIGS:
        raise DraftheadsError(f"head.type: unknown head type '{kind}'{suggest(str(kind), HEAD_CONFIGS)}; use one of {', '.join(HEAD_CONFIGS)}")
    return build(HEAD_CONFIGS[kind], data, "head")


def field_docs(obj: Any) -> dict[str, str]:
    """Field name -> doc string for a config dataclass."""
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(obj)}
