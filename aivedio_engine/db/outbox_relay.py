"""The relay's side of the outbox (`worker.relay`, `worker.undelivered`): claiming due PENDING rows, marking them
PUBLISHED or recording a failed enqueue, and handing the rows of messages a stopping process never finished back.

Claimed rows go to the relay as `OutboxRow` records, built positionally (the claim is the hot path).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.records import OutboxRow
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.status import OutboxStatus

_o = outbox_events.c


def claim_due(conn: Connection, now: datetime, limit: int) -> list[OutboxRow]:
    """Up to `limit` due PENDING rows, oldest id first. On PostgreSQL they are locked `FOR UPDATE SKIP LOCKED`,
    so relays sharing the table never claim a row twice; on SQLite the caller's `BEGIN IMMEDIATE` serializes."""
    query = (
        sa.select(outbox_events)
        .where(_o.status == OutboxStatus.PENDING.value, _o.available_at <= now)
        .order_by(_o.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [OutboxRow(*row) for row in conn.execute(query)]


def mark_published(conn: Connection, ids: Sequence[Any], now: datetime) -> None:
    conn.execute(
        sa.update(outbox_events).where(_o.id.in_(ids)).values(status=OutboxStatus.PUBLISHED.value, published_at=now)
    )


def record_failure(
    conn: Connection, event_id: Any, *, attempts: int, error: str, dead: bool, available_at: datetime
) -> None:
    """A failed enqueue: the row's attempt count and error, and either DEAD or PENDING again at `available_at`."""
    conn.execute(
        sa.update(outbox_events)
        .where(_o.id == event_id)
        .values(
            publish_attempts=attempts,
            last_error=error,
            status=(OutboxStatus.DEAD if dead else OutboxStatus.PENDING).value,
            available_at=available_at,
        )
    )


def hand_back(conn: Connection, ids: Sequence[uuid.UUID], now: datetime) -> int:
    """The PUBLISHED rows of `ids` → PENDING, due `now`; returns how many rows changed."""
    changed = conn.execute(
        sa.update(outbox_events)
        .where(_o.id.in_(ids), _o.status == OutboxStatus.PUBLISHED.value)
        .values(status=OutboxStatus.PENDING.value, available_at=now, published_at=None)
    )
    return int(changed.rowcount or 0)
