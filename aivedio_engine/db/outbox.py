"""Writing outbox rows: always inside the caller's transaction, next to the state change they announce.

On PostgreSQL the same transaction sends `NOTIFY aivedio_outbox`, delivered only on commit, so relays wake up
without polling and never see a row before it exists. In embedded mode an in-process event is set once such a
commit has completed (see `install_commit_wakeup`).
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.events import ROUTES, EventType, Route
from aivedio_engine.domain.status import OutboxStatus

NOTIFY_CHANNEL = "aivedio_outbox"
_DIRTY = "aivedio_outbox_dirty"


def add(
    conn: Connection,
    event_type: EventType,
    *,
    aggregate_type: str,
    aggregate_id: uuid.UUID,
    aggregate_version: int,
    payload: dict[str, Any],
    now: datetime,
    available_at: datetime | None = None,
    tenant_id: uuid.UUID | None = None,
    trace_id: str | None = None,
    causation_id: uuid.UUID | None = None,
    route: Route | None = None,
) -> uuid.UUID:
    """Insert one PENDING outbox row; returns its id, which becomes the broker message id. `route` picks one of
    the event type's alternate routes (e.g. the urgent fetch queue); the default is `ROUTES[event_type]`."""
    event_id = new_id()
    conn.execute(
        outbox_events.insert().values(
            id=event_id,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            aggregate_version=aggregate_version,
            event_type=event_type.value,
            payload=payload,
            status=OutboxStatus.PENDING.value,
            target=(route or ROUTES[event_type]).actor,
            available_at=available_at or now,
            tenant_id=tenant_id,
            trace_id=trace_id,
            causation_id=causation_id,
            created_at=now,
        )
    )
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_notify(:ch, '')"), {"ch": NOTIFY_CHANNEL})
    else:
        conn.info[_DIRTY] = True
    return event_id


def install_commit_wakeup(engine: Engine, wakeup: threading.Event) -> None:
    """Embedded mode: set `wakeup` after any commit that wrote outbox rows.

    SQLAlchemy's "commit" event fires *before* the DBAPI commit, so a relay woken from it could read the old
    snapshot and miss the row until its fallback check. The event only moves the flag to a thread-local; the
    dialect's `do_commit` (a public Dialect method, wrapped on this engine's dialect instance only) sets the
    event once the commit has returned, i.e. when the rows are visible to every other connection.
    """
    pending = threading.local()

    @sa.event.listens_for(engine, "commit")
    def _before_commit(conn: Connection) -> None:
        pending.flag = conn.info.pop(_DIRTY, False)

    @sa.event.listens_for(engine, "rollback")
    def _after_rollback(conn: Connection) -> None:
        conn.info.pop(_DIRTY, None)

    dialect = engine.dialect
    do_commit = dialect.do_commit

    def _commit_then_wake(dbapi_connection: Any) -> None:
        flag, pending.flag = getattr(pending, "flag", False), False
        do_commit(dbapi_connection)
        if flag:
            wakeup.set()

    dialect.do_commit = _commit_then_wake  # type: ignore[method-assign]
