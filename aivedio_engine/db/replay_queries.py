"""The statements of `aivedio replay` (services.replay): the three piles an operator replays (dead letters,
orphan provider events, DEAD outbox rows), read by filter or by id, and the writes that put a row back to work.
Rows go to the service's checks and rendering untouched."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, Row

from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import dead_letters, outbox_events, provider_events
from aivedio_engine.domain.status import OutboxStatus

Pile = Literal["dlq", "orphans", "outbox"]
_dl = dead_letters.c
_pe = provider_events.c
_ob = outbox_events.c
_TABLE = {"dlq": dead_letters, "orphans": provider_events, "outbox": outbox_events}


def matching(
    engine: Engine,
    kind: Pile,
    *,
    provider: str | None,
    actor: str | None,
    error_class: str | None,
    since: datetime | None,
    limit: int,
) -> tuple[int, list[Row[Any]]]:
    """The exact count of the pile's rows that match, and the oldest `limit` of them. Orphans filter by provider;
    dead letters and DEAD outbox rows by actor (the outbox row's target) and a substring of the error."""
    table, order, where = _matching(kind, provider, actor, error_class, since)
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()
        rows = conn.execute(sa.select(table).where(*where).order_by(*order).limit(limit)).all()
    return int(total), list(rows)


def by_ids(conn: Connection, kind: Pile, keys: list[uuid.UUID], lock: bool = False) -> list[Row[Any]]:
    """The pile's rows with these ids, in bounded IN lists; `lock` takes them FOR UPDATE on PostgreSQL."""
    table = _TABLE[kind]
    rows: list[Row[Any]] = []
    for start in range(0, len(keys), 500):  # bounded IN lists
        stmt = sa.select(table).where(table.c.id.in_(keys[start : start + 500]))
        if lock and conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()  # two operators replaying the same rows: the second sees them done
        rows.extend(conn.execute(stmt).all())
    return rows


def mark_letter_replayed(conn: Connection, letter_id: uuid.UUID, now: datetime) -> None:
    conn.execute(dead_letters.update().where(_dl.id == letter_id).values(replayed_at=now))


def upsert_pending_outbox(
    conn: Connection,
    *,
    event_id: uuid.UUID,
    aggregate_type: str,
    aggregate_id: Any,
    aggregate_version: Any,
    event_type: str,
    schema_version: Any,
    payload: Any,
    target: str,
    tenant_id: Any,
    trace_id: Any,
    causation_id: Any,
    occurred_at: datetime,
    now: datetime,
) -> None:
    """Put the event's outbox row back to PENDING, or re-create it under the same id if it is gone."""
    insert = dialect_insert(conn)
    stmt = insert(outbox_events).values(
        id=event_id,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        aggregate_version=aggregate_version,
        event_type=event_type,
        schema_version=schema_version,
        payload=payload,
        status=OutboxStatus.PENDING.value,
        target=target,
        available_at=now,
        publish_attempts=0,
        tenant_id=tenant_id,
        trace_id=trace_id,
        causation_id=causation_id,
        created_at=occurred_at,
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[_ob.id],
            set_={
                "status": OutboxStatus.PENDING.value,
                "available_at": now,
                "publish_attempts": 0,
                "published_at": None,
            },
        )
    )


def other_orphans_of_job(conn: Connection, provider: str, job_id: str, exclude: uuid.UUID) -> list[uuid.UUID]:
    """The ids of the job's other orphan events."""
    return list(
        conn.execute(
            sa.select(_pe.id).where(
                _pe.provider == provider,
                _pe.provider_job_id == job_id,
                _pe.orphan.is_(True),
                _pe.id != exclude,
            )
        )
        .scalars()
        .all()
    )


def republish(conn: Connection, outbox_id: uuid.UUID, now: datetime) -> None:
    """A DEAD outbox row back to PENDING, due now (guarded: still DEAD)."""
    conn.execute(
        outbox_events.update()
        .where(_ob.id == outbox_id, _ob.status == OutboxStatus.DEAD.value)
        .values(status=OutboxStatus.PENDING.value, publish_attempts=0, available_at=now)
    )


def _contains(column: Any, text: str) -> Any:
    return sa.func.lower(column).contains(text.lower(), autoescape=True)


def _matching(
    kind: str, provider: str | None, actor: str | None, error_class: str | None, since: datetime | None
) -> tuple[sa.Table, list[Any], list[Any]]:
    if kind == "orphans":
        where: list[sa.ColumnElement[bool]] = [_pe.orphan.is_(True)]
        if provider:
            where.append(_pe.provider == provider)
        if since:
            where.append(_pe.received_at >= since)
        return provider_events, [_pe.received_at, _pe.id], where
    if kind == "dlq":
        # the stored error is "ClassName: first line", so one substring test serves class and text alike
        where = [_dl.replayed_at.is_(None)]
        if actor:
            where.append(_dl.actor == actor)
        if error_class:
            where.append(_contains(_dl.error, error_class))
        if since:
            where.append(_dl.last_seen_at >= since)
        return dead_letters, [_dl.last_seen_at, _dl.id], where
    where = [_ob.status == OutboxStatus.DEAD.value]
    if actor:
        where.append(_ob.target == actor)
    if error_class:
        where.append(_contains(_ob.last_error, error_class))
    if since:
        # the relay sets available_at to the moment it marks a row DEAD
        where.append(_ob.available_at >= since)
    return outbox_events, [_ob.available_at, _ob.id], where
