"""The inbox (`inbox_dedup`): one row per (consumer group, event) consumed, written in the effect's transaction.

The row is inserted first: on PostgreSQL a concurrent duplicate blocks on the uncommitted primary-key entry and
then finds the conflict, so "check, then act" can never run twice (services.consume).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import inbox_dedup

#: inbox_dedup.result_digest is varchar(128)
_DIGEST_MAX = 128
_i = inbox_dedup.c


def claim(
    conn: Connection, consumer_group: str, event_id: uuid.UUID, aggregate_id: uuid.UUID | None, now: datetime
) -> bool:
    """Insert the dedup row; False: this event was consumed by the group already."""
    insert = dialect_insert(conn)
    stmt = (
        insert(inbox_dedup)
        .values(consumer_group=consumer_group, event_id=event_id, aggregate_id=aggregate_id, processed_at=now)
        .on_conflict_do_nothing(index_elements=[_i.consumer_group, _i.event_id])
        .returning(_i.event_id)
    )
    # RETURNING, not rowcount: psycopg reports -1 for INSERT ... ON CONFLICT DO NOTHING here
    return conn.execute(stmt).first() is not None


def keep_digest(conn: Connection, consumer_group: str, event_id: uuid.UUID, digest: str) -> None:
    """What the first delivery did, for an operator (cut to the column's width)."""
    conn.execute(
        inbox_dedup.update()
        .where(_i.consumer_group == consumer_group, _i.event_id == event_id)
        .values(result_digest=digest[:_DIGEST_MAX])
    )


def consumed(conn: Connection, consumer_group: str, event_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of `event_ids` the group has consumed (their effect committed)."""
    if not event_ids:
        return set()
    rows = conn.execute(
        sa.select(_i.event_id).where(_i.consumer_group == consumer_group, _i.event_id.in_(event_ids))
    ).scalars()
    return set(rows)
