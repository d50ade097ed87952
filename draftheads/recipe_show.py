"""Render a resolved recipe as YAML with each field's doc as a trailing comment."""

from __future__ import annotations

import dataclasses

import yaml

from draftheads.recipe import Recipe


def format_recipe(recipe: Recipe) -> str:
    lines = [f"# resolved from {recipe.source}", f"name: {recipe.name}"]
    for section in ("target", "head", "data", "train", "log", "eval"):
        lines.append(f"{section}:")
        lines.extend(_section_lines(getattr(recipe, section)))
    if recipe.derived:
        lines.append("derived:  # read from the target's config, never written by hand")
        lines.extend(f"  {k}: {_scalar(v)}" for k, v in recipe.derived.items())
    return "\n".join(lines)


def _section_lines(obj) -> list[str]:
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        comment = f"  # {f.metadata['doc']}" if f.metadata.get("doc") else ""
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            out.append(f"  {f.name}:{comment}")
            for item in value:
                data = {k: v for k, v in dataclasses.asdict(item).items()}
                out.append(f"    - {_scalar(data)}")
        else:
            out.append(f"  {f.name}: {_scalar(value)}{comment}")
    return out


def _scalar(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
