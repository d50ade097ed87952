"""Self-validating dataclass configs built from plain dicts (YAML).

`build(cls, data, where)` turns a mapping into a dataclass, rejecting unknown keys
with a "did you mean" suggestion and wrong types with a one-line error; each class
checks its own values in `__post_init__` with `check(...)`. Fields carry their docs
in `metadata["doc"]` (see `doc(...)`), so `recipe show` can explain them, and the
command-line flag that sets them in `metadata["flag"]` (the CLI builds each flag from its
field and reads its text with `from_text`). `load_yaml` reads what a person wrote (a recipe,
an override, a flag) and says where YAML 1.1 turned a word into a boolean.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from typing import Any, Callable, Literal, Union

import yaml

from draftheads.core.errors import DraftheadsError

BOOL_TAG = "tag:yaml.org,2002:bool"


def doc(default: Any, text: str, **more: Any) -> Any:
    """A dataclass field with a default and a one-line doc (and any `more` metadata); mutable defaults are copied."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: _copy(d), metadata={"doc": text, **more})
    return dataclasses.field(default=default, metadata={"doc": text, **more})


def same_as(cls: type, name: str, **more: Any) -> Any:
    """A field declared as dataclass `cls`'s field `name` is: its default, doc and metadata (`more` added), so a
    setting two settings classes take is declared once."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    metadata = {**f.metadata, **more}
    return doc(default, metadata.pop("doc"), **metadata)


def flag_of(cls: type, name: str) -> str | None:
    """The command-line flag that sets dataclass `cls`'s field `name` (its metadata's; None: no flag sets it)."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata.get("flag")


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value)
    return value


def check(condition: bool, message: str) -> None:
    """Raise a one-line user error unless `condition` holds."""
    if not condition:
        raise DraftheadsError(message)


def suggest(name: str, choices: typing.Iterable[str]) -> str:
    """' (did you mean 'x'?)' when a close match exists, else ''."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from mapping `data`; `where` names the section in errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DraftheadsError(f"{where}: expected a mapping of keys to values, got {_describe(data)}")
    names = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in names:
            allowed = ", ".join(sorted(names))
            raise DraftheadsError(
                f"{where}: unknown key '{key}'{suggest(str(key), names)}; allowed keys: {allowed}"
            )
    hints = typing.get_type_hints(cls)
    values = {key: convert(value, hints[key], f"{where}.{key}") for key, value in data.items()}
    try:
        return cls(**values)
    except TypeError as e:  # a required field is missing
        missing = [n for n, f in names.items() if n not in values and _required(f)]
        raise DraftheadsError(f"{where}: missing required key(s) {', '.join(missing)}") from e


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def convert(value: Any, hint: Any, where: str) -> Any:
    """Check `value` against the type `hint`, converting where lossless (int -> float)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(value, option, where)
            except DraftheadsError as e:
                errors.append(str(e))
        raise DraftheadsError(errors[0] if len(errors) == 1
                              else f"{where}: {_describe(value)} fits none of {_name(hint)}")
    if origin is Literal:
        if value in args:
            return value
        options = ", ".join(repr(a) for a in args)
        raise DraftheadsError(f"{where}: {value!r} is not one of {options}{suggest(str(value), map(str, args))}; "
                              "choose one of them")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise DraftheadsError(f"{where}: expected a list, got {_describe(value)}")
        item = args[0] if args else Any
        return [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise DraftheadsError(f"{where}: expected a mapping, got {_describe(value)}")
        return {str(k): convert(v, args[1] if args else Any, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else build(hint, value, where)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML reads 3e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if isinstance(hint, type) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    wanted = KINDS_OF_VALUE.get(hint, _name(hint))
    raise DraftheadsError(f"{where}: expected {_name(hint)}, got {_describe(value)}; give {wanted}")


KINDS_OF_VALUE = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


def from_text(text: Any, hint: Any, where: str) -> Any:
    """A value of type `hint` from what a person typed on a command line, read as YAML reads a recipe's value (a
    list from comma-separated items), then checked by `convert`; text stays text where the type takes it."""
    return convert(_typed(text, hint, where), hint, where)


def _typed(value: Any, hint: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return [item if args[0] is str else _yaml(item, where) for item in split_items(value)]
    if typing.get_origin(hint) is Literal:
        return value   # checked against its options, with a suggestion
    options = [a for a in args if a is not type(None)]
    literals = [a for a in options if typing.get_origin(a) is Literal]
    named = {option for literal in literals for option in typing.get_args(literal)}
    # text where the setting takes text, or names one of its options ('auto' of `int | Literal["auto"]`)
    takes_text = hint is str or str in args or value in named or (literals and len(literals) == len(options))
    return value if takes_text else _yaml(value, where)


def _yaml(text: str, where: str) -> Any:
    """Text as YAML reads it (a yes/no read as a boolean noted); what YAML cannot read ('[1') stays text, for the
    setting's type to refuse in one line."""
    try:
        return load_yaml(text, where)
    except yaml.YAMLError:
        return text


def split_items(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [part.strip() for part in text.split(",") if part.strip()]


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def defaults(obj: Any) -> dict:
    """Field name -> default value of a dataclass (class or instance), as `to_dict` writes it; fields without one
    are left out."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return to_dict(out)


def to_dict(obj: Any) -> Any:
    """A dataclass (nested) as plain YAML-friendly data."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def load_yaml(text: str, where: str = "", note: Callable[[str], None] | None = None) -> Any:
    """`text` as yaml.safe_load reads it; each yes/no/on/off (any case) it read as a boolean is noted (on stderr),
    naming its key under `where`: YAML 1.2 and most people read them as words, PyYAML's YAML 1.1 as true/false.
    The value stays what PyYAML made of it. Raises yaml.YAMLError as safe_load does."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    for key, written in yaml_11_booleans(node, where):
        value = str(yaml.safe_load(written)).lower()
        (note or _stderr)(f"note: {key or 'the value'}: '{written}' read as {value} (YAML 1.1); write {value}, or "
                          f"\"{written}\" in quotes to keep the word")
    return data


def yaml_11_booleans(node: Any, path: str, seen: set | None = None) -> typing.Iterator[tuple[str, str]]:
    """(dotted key, as written) of each boolean under `node` spelled other than true/false, keys included."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:   # an alias points back at a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if node.tag == BOOL_TAG and node.value.lower() not in ("true", "false"):
            yield path, node.value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from yaml_11_booleans(item, f"{path}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            written = key.value if isinstance(key, yaml.ScalarNode) else "?"   # a list as a key: no name
            name = f"{path}.{written}" if path else str(written)
            yield from yaml_11_booleans(key, f"{name} (a key)", seen)
            yield from yaml_11_booleans(value, name, seen)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
