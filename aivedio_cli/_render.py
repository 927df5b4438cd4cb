"""Output and exit codes, in one place: JSON for machines, Rich for people, one-line errors on stderr.

Error convention (every command): one line `error: <message>` on stderr and an exit code from `ExitCode`; when
the command was given `--json`, also `{"error": "<message>", "error_type": "<slug>"}` on stdout — unless the
command already printed its JSON document (which then carries the error itself). Numbers that are money or
quantities are `Decimal` and go out as plain strings ("0.00000000", never "0E-8").

Rich is imported only when something is printed with it: this module is loaded at start-up.
"""

from __future__ import annotations

import json
import sys
import uuid
from decimal import Decimal
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    PARTIAL = 3
    REFUSED = 4
    NOT_FOUND = 5
    #: Ctrl-C (128 + SIGINT, as shells report it): the command stopped following, the tasks continue
    INTERRUPTED = 130


#: the `error_type` of an error that names no more precise one
ERROR_TYPES: dict[int, str] = {
    ExitCode.FAILED: "failed",
    ExitCode.USAGE: "usage",
    ExitCode.PARTIAL: "partial",
    ExitCode.REFUSED: "refused",
    ExitCode.NOT_FOUND: "not_found",
    ExitCode.INTERRUPTED: "interrupted",
}


class _Invocation:
    """What this run of the CLI promised on stdout (set by the root group before parsing)."""

    as_json = False
    emitted = False


def begin_invocation(*, as_json: bool) -> None:
    _Invocation.as_json = as_json
    _Invocation.emitted = False


def out() -> Console:
    """Console on stdout, created per call so CliRunner's captured streams are honoured."""
    from rich.console import Console

    return Console(file=sys.stdout, soft_wrap=True)


def report_error(message: str, code: int, error_type: str | None = None) -> int:
    """Print the error the convention's way (see the module docstring) and return `code`."""
    first_line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    slug = error_type or ERROR_TYPES.get(code, "failed")
    if _Invocation.as_json and not _Invocation.emitted:
        emit_json({"error": first_line, "error_type": slug})
    sys.stdout.flush()
    print(f"error: {first_line}", file=sys.stderr)
    return int(code)


def fail(message: str, code: ExitCode = ExitCode.FAILED, error_type: str | None = None) -> NoReturn:
    """Report one error (one line; JSON too under --json) and exit with `code`."""
    raise typer.Exit(report_error(message, code, error_type))


def parse_id(value: str, what: str) -> uuid.UUID:
    """A UUID argument, or a one-line usage error naming what was expected."""
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a {what} id: {value!r}", ExitCode.USAGE, "bad_id")


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format(value, "f")  # "0.00000000", not "0E-8"
    return str(value)


def to_json(data: Any, *, indent: int | None = 2) -> str:
    """The one JSON encoding of the CLI: sorted keys, Decimals as plain strings, anything else by str()."""
    return json.dumps(data, indent=indent, sort_keys=True, default=_plain)


def emit_json(data: Any) -> None:
    """Stable, sorted JSON on stdout."""
    sys.stdout.write(to_json(data) + "\n")
    _Invocation.emitted = True


def shown_count(shown: int, total: int, noun: str) -> str:
    """ "20 of 28 task(s) shown; --limit shows more" when a limit cut the list, else "28 task(s)"."""
    return f"{shown} of {total} {noun} shown; --limit shows more" if total > shown else f"{total} {noun}"


def print_count(shown: int, total: int, noun: str) -> None:
    """The count line of a list, on stderr: stdout stays the rows alone (or the JSON document)."""
    print(shown_count(shown, total, noun), file=sys.stderr)


def exit_code_for(exc: Exception) -> ExitCode:
    """Service errors → exit codes, in one place."""
    from aivedio_engine.services import errors

    if isinstance(exc, errors.NotFound):
        return ExitCode.NOT_FOUND
    if isinstance(exc, errors.InvalidInput | errors.BadRequest | errors.ModerationRejected):
        return ExitCode.USAGE
    if isinstance(exc, errors.Conflict | errors.InsufficientCredits):
        return ExitCode.REFUSED
    return ExitCode.FAILED


def error_type_for(exc: Exception) -> str:
    """`InsufficientCredits` → "insufficient_credits": the slug of a service error's class."""
    name = type(exc).__name__
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
