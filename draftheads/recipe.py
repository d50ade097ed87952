"""Recipes: one YAML file = one runnable job (target, head, data, train, log, eval).

    recipe = load_recipe("eagle-smollm2", ["train.lr=1e-4"])   # bundled name or a path
    recipe.resolve(target.config)                               # derive sizes from the target

Each section's dataclass lives beside the code that reads it: the head's in heads/ (one per head
type), target and data in data/, train and log in training/, eval in evaluation/. A recipe is assembled here.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from draftheads.core.config import build, check, defaults, load_yaml, suggest, to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import text_config
from draftheads.data.datagen import DataConfig
from draftheads.data.target import TargetConfig
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.heads.factory import HeadConfig, fit_to_target, head_config
from draftheads.training.train_config import TrainConfig
from draftheads.training.trackers import LogConfig

SECTIONS = {"target": TargetConfig, "data": DataConfig, "train": TrainConfig, "log": LogConfig, "eval": EvalConfig}
PARTS = ("target", "head", "data", "train", "log", "eval")   # a recipe's sections, in the order it is written


@dataclass
class Recipe:
    """A whole job. `derived` holds the values read from the target by `resolve`."""

    name: str
    target: TargetConfig
    head: HeadConfig
    data: DataConfig
    train: TrainConfig
    log: LogConfig
    eval: EvalConfig
    source: str = ""
    derived: dict = dataclasses.field(default_factory=dict)

    def resolve(self, target_config) -> "Recipe":
        """Derive hidden size, vocabulary and layer count (and head values that follow) from the target."""
        text = text_config(target_config)
        self.derived = {
            "architecture": (getattr(target_config, "architectures", None) or ["?"])[0],
            "model_type": target_config.model_type,
            "hidden_size": text.hidden_size,
            "vocab_size": text.vocab_size,
            "num_layers": text.num_hidden_layers,
        }
        self.head.resolve(text.num_hidden_layers, text.vocab_size)
        fit_to_target(self.head, target_config)
        return self

    def to_dict(self) -> dict:
        out = {"name": self.name}
        out.update({s: to_dict(getattr(self, s)) for s in PARTS})
        if self.derived:
            out["derived"] = dict(self.derived)
        return out

    def defaults(self) -> dict:
        """section -> key -> the default of every setting of this recipe's sections (its head type's included)."""
        return {s: defaults(getattr(self, s)) for s in PARTS}

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
            raise DraftheadsError(f"recipe file '{name_or_path}' not found; give a YAML path or one of: "
                                  f"{', '.join(bundled_recipes())}")
        return path.read_text(), str(path)
    names = bundled_recipes()
    if name_or_path not in names:
        raise DraftheadsError(f"unknown recipe '{name_or_path}'{suggest(name_or_path, names)}; bundled: "
                              f"{', '.join(names)}")
    resource = importlib.resources.files("draftheads.recipes") / f"{name_or_path}.yaml"
    return resource.read_text(), f"bundled:{name_or_path}"


def load_recipe(name_or_path: str, overrides: list[str] = ()) -> Recipe:
    """Load, override (`section.key=value`) and validate a recipe."""
    text, source = read_recipe_text(name_or_path)
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise DraftheadsError(f"recipe {source} is not valid YAML{at}: {getattr(e, 'problem', e)}; correct the "
                              "file there") from None
    if not isinstance(data, dict):
        raise DraftheadsError(f"recipe {source} must be a mapping with sections target, head, data, train, log, eval")
    for item in overrides:
        apply_override(data, item)
    return recipe_from_dict(data, source, default_name=Path(source.split(":")[-1]).stem)


def apply_override(data: dict, item: str) -> None:
    """Set `a.b.c=value` in the nested dict; the value is parsed as YAML (a yes/no read as a boolean noted)."""
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
        node[parts[-1]] = load_yaml(raw, key.strip()) if raw.strip() else None
    except yaml.YAMLError:
        node[parts[-1]] = raw


# The names other tools (SpecForge, speculators, HF Trainer) give these settings -> ours. Accepted in a recipe file and
# in overrides, with or without their section (`learning_rate=1e-4`, `train.learning_rate=1e-4`), with a note.
ALIASES = {
    "learning_rate": "train.lr", "gradient_accumulation_steps": "train.grad_accum",
    "max_checkpoints": "train.keep_last",
    "save_total_limit": "train.keep_last", "resume_from": "train.resume", "resume_from_checkpoint": "train.resume",
    "ttt_length": "head.ttt_steps", "aux_hidden_state_layer_ids": "head.feature_layers",
}


def resolve_aliases(data: dict, note=lambda line: print(line, file=sys.stderr)) -> None:
    """Move every alias (top level or in its own section) to our name, in place, noting each; an alias and our
    name both given is an error, since one would silently win."""
    for alias, ours in ALIASES.items():
        section, key = ours.split(".")
        places = [(data, alias)] + ([(data[section], alias)] if isinstance(data.get(section), dict) else [])
        for where, name in places:
            if name not in where:
                continue
            target = data.setdefault(section, {})
            if not isinstance(target, dict):
                raise DraftheadsError(f"recipe: '{section}' must be a section")
            if key in target:
                raise DraftheadsError(f"recipe: both '{alias}' and '{ours}' are set; keep only {ours}")
            target[key] = where.pop(name)
            note(f"note: '{alias}' is {ours} in draftheads; using {ours}={target[key]!r}")


def recipe_from_dict(data: dict, source: str = "<dict>", default_name: str = "run") -> Recipe:
    resolve_aliases(data)
    allowed = ("name",) + tuple(SECTIONS) + ("head",)
    for key in data:
        if key not in allowed:
            raise DraftheadsError(f"recipe: unknown section '{key}'{suggest(str(key), allowed)}; sections: "
                                  f"{', '.join(allowed)}")
    name = data.get("name", default_name)
    check(isinstance(name, str) and name.strip() != "", "recipe: name must be a non-empty string")
    sections = {s: build(cls, data.get(s), s) for s, cls in SECTIONS.items()}
    return Recipe(name=name, head=head_config(data.get("head")), source=source, **sections)
