"""Writing outbox rows: always inside the caller's transaction, next to the state change they announce.

Once the transaction has committed, the relays are woken (`db.wakeup`: a coalesced `NOTIFY aivedio_outbox` sent
after the commit on PostgreSQL, an in-process event in embedded mode), so they never look before the row exists.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db import wakeup as wakeups
from aivedio_engine.db.session import run_prebuilt, run_prebuilt_on_loop
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.events import ROUTES, EventType, Route
from aivedio_engine.domain.status import OutboxStatus

NOTIFY_CHANNEL = wakeups.OUTBOX


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
    values = row(
        event_type,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        aggregate_version=aggregate_version,
        payload=payload,
        now=now,
        available_at=available_at,
        tenant_id=tenant_id,
        trace_id=trace_id,
        causation_id=causation_id,
        route=route,
    )
    run_prebuilt(conn, _insert(tuple(values)), dict(values))
    wakeups.notify(conn, NOTIFY_CHANNEL)
    return values["id"]  # type: ignore[no-any-return]


@functools.cache
def _insert(columns: tuple[str, ...]) -> Any:
    """The insert of `row`'s columns, built once with a named bind per column, so `run_prebuilt` sends it compiled
    once (SQLAlchemy's work per execute around it was ~8 % of the reducer's CPU through Dramatiq, py-spy)."""
    return outbox_events.insert().values({c: sa.bindparam(c) for c in columns})


def row(
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
) -> dict[str, Any]:
    """The column values of one PENDING outbox row (for writers that insert it inside a larger statement)."""
    return dict(
        id=new_id(),
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


async def oldest_due_on_loop(pool: Any, now: datetime) -> datetime | None:
    """`oldest_due` on the API's loop pool (db/async_pool.py)."""
    async with pool.connection() as raw:
        cur = await run_prebuilt_on_loop(raw, _OLDEST_DUE, {"pending": OutboxStatus.PENDING.value, "now": now})
        row = await cur.fetchone()
    return None if row is None else row[0]


def oldest_due(conn: Connection, now: datetime) -> datetime | None:
    """When the longest-waiting due PENDING row became due (index ix_outbox_events_pending); None when none is due."""
    return conn.execute(_OLDEST_DUE, {"pending": OutboxStatus.PENDING.value, "now": now}).scalar()


#: built once, run by both the blocking and the loop path
_OLDEST_DUE = sa.select(sa.func.min(outbox_events.c.available_at)).where(
    outbox_events.c.status == sa.bindparam("pending"), outbox_events.c.available_at <= sa.bindparam("now")
)


def has_pending(conn: Connection, aggregate_id: uuid.UUID, event_type: EventType) -> bool:
    """Whether a PENDING row of `event_type` waits for `aggregate_id` (due or delayed)."""
    o = outbox_events.c
    pending = sa.select(o.id).where(
        o.aggregate_id == aggregate_id, o.event_type == event_type.value, o.status == OutboxStatus.PENDING.value
    )
    return conn.execute(pending.limit(1)).first() is not None
