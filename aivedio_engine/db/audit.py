"""The operator audit trail (`audit_log`): one row per operator action, written in the action's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import audit_log


def insert_entry(
    conn: Connection,
    *,
    actor: str,
    command: str,
    reason: str | None,
    args: Any,
    affected_ids: Sequence[str],
    outcome: str,
    dry_run: bool,
    now: datetime,
) -> None:
    """Append one audit row in the caller's transaction."""
    conn.execute(
        audit_log.insert().values(
            id=new_id(),
            actor=actor,
            command=command,
            reason=reason,
            args=args,
            affected_ids=list(affected_ids),
            outcome=outcome,
            dry_run=dry_run,
            created_at=now,
        )
    )


def recent(engine: Engine, *, limit: int, command: str | None) -> list[sa.Row[Any]]:
    """The newest audit rows first, optionally of one command."""
    stmt = sa.select(audit_log).order_by(audit_log.c.created_at.desc(), audit_log.c.id.desc()).limit(limit)
    if command:
        stmt = stmt.where(audit_log.c.command == command)
    with engine.connect() as conn:
        return list(conn.execute(stmt))
