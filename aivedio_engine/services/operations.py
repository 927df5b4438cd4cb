"""What every operator action shares: who did it, why, and an `audit_log` row in the same
transaction as the change. CLI commands and TUI screens build an `Operation` and pass it to a service; the
service writes the audit row with the rows it affected, so no front end can mutate without leaving a trace.

A dry run changes nothing but is recorded too (`dry_run = true`): the preview an operator acted on is part of
the story at 3 a.m.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aivedio_engine.db import audit
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.services.errors import InvalidInput

MAX_REASON = 2000


def current_operator() -> str:
    """`$AIVEDIO_OPERATOR`, else user@host of this process."""
    explicit = os.environ.get("AIVEDIO_OPERATOR", "").strip()
    if explicit:
        return explicit[:128]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"[:128]


@dataclass(frozen=True)
class Operation:
    """One operator action: `command` (e.g. "ledger adjust"), its arguments, and the reason given."""

    command: str
    reason: str | None
    actor: str = field(default_factory=current_operator)
    dry_run: bool = False
    args: dict[str, Any] = field(default_factory=dict)

    def require_reason(self) -> str:
        """Mutations need a reason; a dry run does not."""
        reason = (self.reason or "").strip()
        if not reason and not self.dry_run:
            raise InvalidInput("a --reason is required for this change", field="reason")
        return reason[:MAX_REASON]


def record(conn: Connection, op: Operation, *, affected_ids: Sequence[Any], outcome: str, now: datetime) -> None:
    """Append the audit row for `op` in the caller's transaction."""
    audit.insert_entry(
        conn,
        actor=op.actor,
        command=op.command,
        reason=(op.reason or "").strip()[:MAX_REASON] or None,
        args=_json_safe(op.args),
        affected_ids=[str(i) for i in affected_ids],
        outcome=outcome[:32],
        dry_run=op.dry_run,
        now=now,
    )


def recent(engine: Engine, *, limit: int = 50, command: str | None = None) -> list[Any]:
    """The newest audit rows first."""
    return audit.recent(engine, limit=limit, command=command)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
