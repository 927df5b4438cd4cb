"""Raw provider events (`provider_events`): one row per distinct observation, and orphans waiting for their attempt.

A repeat delivery is the same row (unique provider + dedup key), so both inserts ignore the conflict; the one
that queues work for the reducer says whether it stored anything.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Row

from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import provider_events

_pe = provider_events.c


def store(
    conn: Connection,
    *,
    event_id: uuid.UUID,
    provider: str,
    source: str,
    webhook_id: str | None,
    dedup_key: str,
    verified: bool,
    headers_digest: str | None,
    body: bytes | None,
    now: datetime,
    expires_at: datetime,
    observation: dict[str, Any] | None = None,
    job_id: str | None = None,
    request_key: str | None = None,
    matched_attempt_id: uuid.UUID | None = None,
    rejected: str | None = None,
) -> bool:
    """Store an observation; an unmatched one is an orphan. False: a repeat, nothing stored. With `rejected` (why
    it cannot be used) the event is kept raw for an engineer, never an orphan, and False is returned."""
    values: dict[str, Any] = dict(
        id=event_id,
        provider=provider,
        source=source,
        webhook_id=webhook_id,
        dedup_key=dedup_key,
        verified=verified,
        headers_digest=headers_digest,
        body=body,
    )
    if rejected is not None:
        values.update(orphan=False, received_at=now, expires_at=expires_at, observation={"rejected": rejected})
        conn.execute(_insert_ignore(conn, values))
        return False
    values.update(
        provider_job_id=job_id,
        provider_request_key=request_key,
        matched_attempt_id=matched_attempt_id,
        orphan=matched_attempt_id is None,
        received_at=now,
        expires_at=expires_at,
        observation=observation,
    )
    return conn.execute(_insert_ignore(conn, values).returning(_pe.id)).first() is not None


def _insert_ignore(conn: Connection, values: dict[str, Any]) -> Any:
    insert = dialect_insert(conn)
    return insert(provider_events).values(**values).on_conflict_do_nothing(index_elements=[_pe.provider, _pe.dedup_key])


def orphans_of(conn: Connection, provider: str, job_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(
            sa.select(provider_events).where(_pe.provider == provider, _pe.provider_job_id == job_id, _pe.orphan)
        ).all()
    )


def match(conn: Connection, event_id: uuid.UUID, attempt_id: uuid.UUID) -> None:
    conn.execute(provider_events.update().where(_pe.id == event_id).values(orphan=False, matched_attempt_id=attempt_id))


def unmatch(conn: Connection, event_id: uuid.UUID) -> None:
    """Make a matched event an orphan again (a no-op on one that already is)."""
    conn.execute(
        provider_events.update()
        .where(_pe.id == event_id, _pe.orphan.is_(False))
        .values(orphan=True, matched_attempt_id=None)
    )
