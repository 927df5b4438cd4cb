"""Output and exit codes, in one place: JSON for machines, Rich for people, one-line errors on stderr."""

from __future__ import annotations

import json
import sys
import uuid
from enum import IntEnum
from typing import Any, NoReturn

import typer
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


def out() -> Console:
    """Console on stdout, created per call so CliRunner's captured streams are honoured."""
    return Console(file=sys.stdout, soft_wrap=True)


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Print one line `error: ...` on stderr and exit with `code`."""
    first_line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    print(f"error: {first_line}", file=sys.stderr)
    raise typer.Exit(int(code))


def parse_id(value: str, what: str) -> uuid.UUID:
    """A UUID argument, or a one-line usage error naming what was expected."""
    try:
        return uuid.UUID(value)
    except ValueError:
        fail(f"not a {what} id: {value!r}", ExitCode.USAGE)


def emit_json(data: Any) -> None:
    """Stable, sorted JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def exit_code_for(exc: Exception) -> ExitCode:
    """Service errors → exit codes, in one place."""
    from aivedio_engine.services import errors

    if isinstance(exc, errors.NotFound):
        return ExitCode.NOT_FOUND
    if isinstance(exc, errors.InvalidInput | errors.BadRequest):
        return ExitCode.USAGE
    if isinstance(exc, errors.Conflict | errors.InsufficientCredits):
        return ExitCode.REFUSED
    return ExitCode.FAILED
