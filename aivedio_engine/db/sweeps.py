"""The sweeper's scans (services.sweeper): what a lost message or a dead process left behind, found by its rows.

Each scan reads a page of ids (or the few columns the repair needs) in the caller's connection; the sweeper then
repairs row by row, each in its own transaction under the task's lock. SQLAlchemy Core only, so PostgreSQL and
SQLite answer alike.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import generation_tasks, outbox_events, provider_events, task_attempts
from aivedio_engine.domain.status import AttemptStatus, OutboxStatus, TaskStatus
from aivedio_engine.domain.transitions import DEADLINE_GOVERNS

_t, _a, _o, _pe = generation_tasks.c, task_attempts.c, outbox_events.c, provider_events.c


@dataclass(frozen=True, slots=True)
class LostSubmit:
    """A NEW attempt of a DISPATCHING task whose submit message is presumed lost, with what its resend needs."""

    id: uuid.UUID
    task_id: uuid.UUID
    tenant_id: uuid.UUID
    trace_id: str | None
    version: int


@dataclass(frozen=True, slots=True)
class ExpiredOrphan:
    """An orphan provider event whose TTL passed unmatched."""

    id: uuid.UUID
    provider: str
    provider_job_id: str | None


def _ids(conn: Connection, stmt: sa.Select[Any], limit: int) -> list[uuid.UUID]:
    return [row[0] for row in conn.execute(stmt.limit(limit))]


def retry_due(conn: Connection, now: datetime, limit: int) -> list[uuid.UUID]:
    """RETRY_WAIT tasks whose next_retry_at has passed."""
    stmt = sa.select(_t.id).where(_t.status == TaskStatus.RETRY_WAIT.value, _t.next_retry_at <= now)
    return _ids(conn, stmt, limit)


def past_deadline(conn: Connection, now: datetime, limit: int) -> list[uuid.UUID]:
    """Tasks the deadline still governs (no output produced yet) whose deadline_at has passed."""
    governed = [s.value for s in DEADLINE_GOVERNS]
    return _ids(conn, sa.select(_t.id).where(_t.status.in_(governed), _t.deadline_at <= now), limit)


def lost_submits(conn: Connection, now: datetime, limit: int) -> list[LostSubmit]:
    """NEW attempts of DISPATCHING tasks whose next_action_at has passed."""
    rows = conn.execute(
        sa.select(_a.id, _a.task_id, _t.tenant_id, _t.trace_id, _t.version)
        .join(generation_tasks, _t.id == _a.task_id)
        .where(
            _t.status == TaskStatus.DISPATCHING.value,
            _a.submit_state == AttemptStatus.NEW.value,
            _t.next_action_at <= now,
        )
        .limit(limit)
    ).all()
    return [LostSubmit(r.id, r.task_id, r.tenant_id, r.trace_id, int(r.version)) for r in rows]


def stuck_sending(conn: Connection, idle_since: datetime, limit: int) -> list[uuid.UUID]:
    """SENDING attempts untouched since `idle_since`."""
    stmt = sa.select(_a.id).where(_a.submit_state == AttemptStatus.SENDING.value, _a.updated_at <= idle_since)
    return _ids(conn, stmt, limit)


def stuck_in_step(
    conn: Connection, status: str, request_type: str, idle_since: datetime, limit: int
) -> list[uuid.UUID]:
    """Tasks in `status` untouched since `idle_since` with no PENDING outbox row of `request_type` of their own."""
    pending = sa.exists().where(
        _o.aggregate_id == _t.id, _o.event_type == request_type, _o.status == OutboxStatus.PENDING.value
    )
    return _ids(conn, sa.select(_t.id).where(_t.status == status, _t.updated_at <= idle_since, ~pending), limit)


def expired_orphans(conn: Connection, now: datetime, limit: int) -> list[ExpiredOrphan]:
    """Orphan provider events whose expires_at has passed."""
    rows = conn.execute(
        sa.select(_pe.id, _pe.provider, _pe.provider_job_id).where(_pe.orphan, _pe.expires_at <= now).limit(limit)
    ).all()
    return [ExpiredOrphan(r.id, r.provider, r.provider_job_id) for r in rows]


def extend_orphan(conn: Connection, event_id: uuid.UUID, expires_at: datetime) -> None:
    conn.execute(provider_events.update().where(_pe.id == event_id).values(expires_at=expires_at))
