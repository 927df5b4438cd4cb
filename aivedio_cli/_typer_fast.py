"""Two local adjustments to Typer, made once when the CLI starts (`_group` imports this module).

1. Coercion without pydantic for plain options. Typer ≥ 0.2x coerces every option value, defaults included, through
   a pydantic TypeAdapter; importing pydantic costs ~0.35 s, which alone broke the start-up budget of shell
   completion (`aivedio tasks list --status <Tab>` parses the root's and the command's options). Text, numbers
   (with their min/max), paths and options with a `parser` — all our completion-relevant options — are coerced
   here; any other annotation (enums, choices, files…) still goes through Typer's own path.
2. Help in plain words: Typer prints an option's Python type (`<list[Path]>`, `<str>`, `<bool>`).

Both hook private Typer names; tests/cli/test_conventions.py fails if a Typer upgrade moves them.
"""

from __future__ import annotations

import enum
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from typer import _click as click
from typer._click.exceptions import BadParameter
from typer._coercion import RuntimeParam
from typer._display import describe_number_range
from typer.core import _TyperParameter


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "t", "yes", "y", "on"):
        return True
    if text in ("0", "false", "f", "no", "n", "off"):
        return False
    raise ValueError(text)


_SCALARS: dict[Any, Any] = {str: str, int: int, float: float, Path: Path, bool: _bool}
_WORDS = {int: "an integer", float: "a number", _bool: "true or false"}


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


@dataclass(frozen=True)
class _Plain(RuntimeParam):
    """str / int / float / Path, optional or a list of them, or anything behind a `parser`."""

    item: Any = None

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: click.Context) -> Any:
        if isinstance(value, list | tuple):
            return [self._one(v, param, ctx) for v in value]
        return self._one(value, param, ctx)

    def _one(self, value: Any, param: _TyperParameter, ctx: click.Context) -> Any:
        info = self.parameter_info
        try:
            if info.parser is not None:
                return info.parser(value) if isinstance(value, str) else value
            converted = self.item(value)
        except BadParameter as exc:
            raise BadParameter(exc.message, ctx=ctx, param=param) from None
        except ValueError:
            raise BadParameter(f"{value!r} is not {_WORDS.get(self.item, 'valid')}.", ctx=ctx, param=param) from None
        if self.item in (int, float):
            low, high = info.min, info.max
            if (low is not None and converted < low) or (high is not None and converted > high):
                if info.clamp:
                    converted = max(converted, low) if low is not None else converted
                    return min(converted, high) if high is not None else converted
                bounds = describe_number_range(low, high)
                raise BadParameter(f"{converted} is not in the range {bounds}.", ctx=ctx, param=param)
        return converted


def _path_checks(info: Any) -> bool:
    return bool(
        info.exists
        or not info.file_okay
        or not info.dir_okay
        or info.writable
        or not info.readable
        or info.resolve_path
        or info.allow_dash
        or info.path_type is not None
    )


@dataclass(frozen=True)
class _Choice(RuntimeParam):
    """An Enum option: the member whose value was typed (Typer's default is case-sensitive too)."""

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: click.Context) -> Any:
        enum = _without_none(self.annotation)
        if isinstance(value, enum):
            return value
        for member in enum:
            if member.value == value:
                return member
        choices = ", ".join(repr(m.value) for m in enum)
        raise BadParameter(f"{value!r} is not one of {choices}.", ctx=ctx, param=param)


def _plain_runtime_param(param: _TyperParameter) -> RuntimeParam | None:
    descriptor = param.type_descriptor
    if descriptor.file_annotation is not None:
        return None
    info, annotation = descriptor.parameter_info, descriptor.annotation
    if _path_checks(info):  # exists=, resolve_path=, …: Typer's own checks
        return None
    if info.parser is not None:
        return _Plain(parameter_info=info, annotation=annotation)
    base = _without_none(annotation)
    if isinstance(base, type) and issubclass(base, enum.Enum) and info.case_sensitive is not False:
        return _Choice(parameter_info=info, annotation=annotation)
    if get_origin(base) is list:
        base = get_args(base)[0]
        if base not in (str, Path):
            return None
    item = _SCALARS.get(base)
    return _Plain(parameter_info=info, annotation=annotation, item=item) if item is not None else None


_typer_runtime_param = _TyperParameter.get_runtime_param


def _get_runtime_param(self: _TyperParameter) -> RuntimeParam:
    if self._runtime_param is None:
        self._runtime_param = _plain_runtime_param(self) or _typer_runtime_param(self)
    return self._runtime_param


#: Typer's labels → the words people read in `--help`
_PLAIN_TYPES = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "NUMBER",
    "int range": "INTEGER",
    "float range": "NUMBER",
    "Path": "PATH",
    "file": "FILE",
    "directory": "FOLDER",
    "UUID": "ID",
    "datetime": "TIME",
}
_python_display_type = _TyperParameter.display_type


def _plain_display_type(self: _TyperParameter, ctx: click.Context) -> str:
    label = _python_display_type(self, ctx).removeprefix("<").removesuffix(">")
    if label == "bool":
        return ""  # a flag takes no value
    repeatable = label.startswith("list[") and label.endswith("]")
    label = label.removeprefix("list[").removesuffix("]") if repeatable else label
    word = _PLAIN_TYPES.get(label, label if "|" in label else "VALUE")
    return f"{word} (repeatable)" if repeatable else word


def install() -> None:
    _TyperParameter.get_runtime_param = _get_runtime_param  # type: ignore[method-assign]
    _TyperParameter.display_type = _plain_display_type  # type: ignore[method-assign]
