"""What one data-changing action is, as the app's single mutation path sees it (`AivedioApp.mutate`).

A screen describes the change — the command recorded in the audit log, what the confirmation shows, and the
service call — and hands it over; it never calls a mutating service itself. That keeps read-only mode, the
confirmation with a reason, the audit `Operation` and the refresh afterwards in one place (the k9s lesson:
read-only leaks came from sub-views enforcing it on their own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aivedio_engine.db.handles import DBAPIError, OperationalError
from aivedio_engine.services.errors import ServiceError
from aivedio_engine.services.operations import Operation


@dataclass(frozen=True)
class Mutation:
    #: audit command, e.g. "tui review approve"
    command: str
    #: the confirmation's title, e.g. "Approve review item 0193…"
    title: str
    #: what exactly will change: count, ids, current state (shown before the reason is asked for)
    lines: Sequence[str]
    #: the service call; returns the toast text. Runs in a worker thread.
    run: Callable[[Operation], str]
    args: dict[str, Any] = field(default_factory=dict)
    reason_required: bool = True


def explain(exc: BaseException) -> str:
    """A one-line message for a failed load or change (service refusals are meant for operators as they are)."""
    if isinstance(exc, ServiceError):
        return str(exc)
    if isinstance(exc, OperationalError):
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        return f"database unavailable: {first}"
    return f"{type(exc).__name__}: {exc}"[:300]


def schema_missing(exc: BaseException) -> bool:
    """The database has no engine tables (never migrated): a state to explain once, not an error per refresh."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    if getattr(exc.orig, "sqlstate", None) == "42P01":
        return True
    first = str(exc.orig).splitlines()[0].lower() if str(exc.orig) else ""
    return "no such table" in first or ("relation" in first and "does not exist" in first)
