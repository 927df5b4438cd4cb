"""The configuration reference: every key of the settings model (aivedio_engine/config.py) with its type, default,
environment variable and description.

A key's description is its `#:` comment in config.py, else the comment right above it in the shipped aivedio.toml;
defaults are the model's own (no file, no environment), so the reference says what an empty config means.
"""

from __future__ import annotations

import inspect
import re
import typing
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from aivedio_engine.config import Settings
from docsgen import REPO

ENV_PREFIX = "AIVEDIO_"
ENV_DELIMITER = "__"
#: placeholder segments of dict-valued sections (providers.<name>, models.<model>)
_PLACEHOLDER = {"providers": "<name>", "models": "<model>"}
#: marks a description borrowed from the commented field just above (used only when the TOML file has none)
GROUPED = "\0"


class _Defaults(Settings):
    """The model's own defaults: no TOML file, no AIVEDIO_* variables of the machine that runs the generator."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def render() -> str:
    toml_notes = _toml_comments((REPO / "aivedio.toml").read_text(encoding="utf-8"))
    rows: list[tuple[str, str, list[str]]] = []  # (section, its description, table rows)
    _walk(Settings, _Defaults(), [], rows, toml_notes)
    out = []
    for section, doc, lines in rows:
        if not lines:
            continue
        out.append(f"### `{section}`" if section else "### top level")
        out.append("")
        if doc:
            out += [doc, ""]
        out.append("| key | type | default | environment variable | description |")
        out.append("|---|---|---|---|---|")
        out += lines
        out.append("")
    return "\n".join(out)


def _walk(
    cls: type[BaseModel], instance: Any, path: list[str], rows: list[tuple[str, str, list[str]]], notes: dict[str, str]
) -> None:
    mine: list[str] = []
    own_doc = cls.__dict__.get("__doc__") or ""  # not an inherited docstring (pydantic's BaseModel has one)
    rows.append((".".join(path), " ".join(own_doc.split()) if cls is not Settings else "", mine))
    comments: dict[str, str] = {}
    for base in reversed(cls.__mro__):  # a section that extends another keeps the comments of the fields it inherits
        if base.__module__ == cls.__module__:
            comments.update(_source_comments(base))
    for name, field in cls.model_fields.items():
        value = getattr(instance, name) if instance is not None else _field_default(field)
        annotation = field.annotation
        nested = _model_of(annotation)
        if nested is not None:
            _walk(nested, value, [*path, name], rows, notes)
            continue
        mapped = _dict_model_of(annotation)
        if mapped is not None:
            if value:
                described = ", ".join(f"`{k}`" for k in value)
                mine.append(_row([*path, name], "table", f"{described} configured", "", comments.get(name, "")))
            entry = mapped() if _constructible(mapped) else None
            _walk(mapped, entry, [*path, name, _PLACEHOLDER.get(name, "<key>")], rows, notes)
            continue
        own = comments.get(name, "")
        from_toml = notes.get(_toml_key([*path, name]), "")
        # a key's own comment first; a comment shared with the key above only when the TOML file says nothing
        note = (from_toml or own.removeprefix(GROUPED)) if own.startswith(GROUPED) else (own or from_toml)
        mine.append(_row([*path, name], _type(annotation), _default(value), _constraints(field), note))


def _row(path: list[str], type_: str, default: str, constraints: str, note: str) -> str:
    env = ENV_PREFIX + ENV_DELIMITER.join(p.strip("<>").upper() if p.startswith("<") else p.upper() for p in path)
    env = re.sub(r"__(NAME|MODEL)(__|$)", r"__<\1>\2", env)
    kind = f"{type_} ({constraints})" if constraints else type_
    cells = [f"`{path[-1]}`", kind, default, f"`{env}`", note]
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _dict_model_of(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is dict:
        _, value = typing.get_args(annotation)
        return _model_of(value)
    return None


def _constructible(cls: type[BaseModel]) -> bool:
    return all(not f.is_required() for f in cls.model_fields.values())


def _field_default(field: FieldInfo) -> Any:
    return None if field.is_required() else field.get_default(call_default_factory=True)


def _type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type(a) for a in args if a is not type(None)) + " (optional)"
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"table of {_type(args[1])}"
    names = {
        SecretStr: "secret",
        Decimal: "decimal",
        Path: "path",
        float: "number",
        int: "integer",
        str: "string",
        bool: "boolean",
    }
    if inspect.isclass(annotation) and issubclass(annotation, Enum):
        return " | ".join(f'"{m.value}"' for m in annotation)
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(value: Any) -> str:
    return f"`{_toml(value)}`" if value is not None else "unset"


def _toml(value: Any) -> str:
    if isinstance(value, SecretStr):
        return '""' if not value.get_secret_value() else '"**********"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return f'"{value.value}"'
    if isinstance(value, (str, Path, Decimal)):
        return f'"{value.as_posix() if isinstance(value, Path) else value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }" if value else "{}"
    return repr(value)


def _constraints(field: FieldInfo) -> str:
    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for item in field.metadata:
        for attr, symbol in symbols.items():
            bound = getattr(item, attr, None)
            if bound is not None:
                out.append(f"{symbol} {bound}")
    return ", ".join(out)


def _source_comments(cls: type) -> dict[str, str]:
    """`#:` comment lines right above a field of the class body → that field's description."""
    out: dict[str, str] = {}
    pending: list[str] = []
    previous = ""
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        field = re.match(r"([a-z_][a-z0-9_]*)\s*:", stripped)
        if field and pending:
            out[field.group(1)] = " ".join(pending)
        elif field and previous in out:
            # one comment above a group of fields, e.g. min_free_bytes and min_free_ratio: they point at the first
            out[field.group(1)] = out[previous] if out[previous].startswith(GROUPED) else f"{GROUPED}see `{previous}`."
        previous = field.group(1) if field else ""
        pending = []
    return out


def _toml_key(path: list[str]) -> str:
    """providers.<name>.models.<model>.x → the shape of the shipped file's tables, providers.*.models.*.x."""
    return ".".join("*" if p.startswith("<") else p for p in path)


def _toml_comments(text: str) -> dict[str, str]:
    """The comment block right above each `key = value` (or commented-out `# key = value`) of a TOML file."""
    out: dict[str, str] = {}
    table: list[str] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        header = re.fullmatch(r"#?\s*\[([^\]]+)\]", stripped)
        key = re.fullmatch(r"#?\s*([a-z_][a-z0-9_]*)\s*=.*", stripped)
        if header:
            parts = header.group(1).split(".")
            # the shipped file names real providers and models; the reference documents them all as one shape
            table = ["*" if i > 0 and parts[i - 1] in _PLACEHOLDER else p for i, p in enumerate(parts)]
            pending = []
        elif key:
            if pending:
                out.setdefault(".".join([*table, key.group(1)]), " ".join(pending))
            pending = []
        elif stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        else:
            pending = []
    return out
