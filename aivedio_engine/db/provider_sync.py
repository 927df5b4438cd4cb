"""What talking to providers about jobs we already have reads and records (services.sync): the polls due, the
ambiguous submits due a lookup, the cancels due, the bookkeeping of a poll or a lookup, and the attempts a
vendor's job listing is matched against. The caller's connection is its unit of work; no provider is called here.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.status import AttemptStatus, TaskStatus

_a = task_attempts.c
_t = generation_tasks.c
POLLABLE = (AttemptStatus.ACKED.value, AttemptStatus.RUNNING.value)


@dataclass(frozen=True, slots=True)
class DuePoll:
    """An ACKED/RUNNING attempt whose next poll is due, with what scheduling the next one needs."""

    id: uuid.UUID
    provider: str
    provider_job_id: str
    submitted_at: datetime | None
    output_url_expires_at: datetime | None
    provider_error_code: str | None
    task_status: str
    deadline_at: datetime | None


@dataclass(frozen=True, slots=True)
class DueLookup:
    attempt_id: uuid.UUID
    task_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Rival:
    """Another request of ours with the same fingerprint that may own a listed job."""

    id: uuid.UUID
    submit_state: str


def due_polls(conn: Connection, now: datetime, limit: int) -> list[DuePoll]:
    """Attempts holding a job whose next_poll_at has passed, the longest due first."""
    rows = conn.execute(
        sa.select(
            _a.id,
            _a.provider,
            _a.provider_job_id,
            _a.submitted_at,
            _a.output_url_expires_at,
            _a.provider_error_code,
            _t.status.label("task_status"),
            _t.deadline_at,
        )
        .join(generation_tasks, _t.id == _a.task_id)
        .where(_a.submit_state.in_(POLLABLE), _a.next_poll_at <= now, _a.provider_job_id.is_not(None))
        .order_by(_a.next_poll_at)
        .limit(limit)
    ).all()
    return [
        DuePoll(
            id=r.id,
            provider=r.provider,
            provider_job_id=r.provider_job_id,
            submitted_at=r.submitted_at,
            output_url_expires_at=r.output_url_expires_at,
            provider_error_code=r.provider_error_code,
            task_status=r.task_status,
            deadline_at=r.deadline_at,
        )
        for r in rows
    ]


def record_poll(conn: Connection, attempt_id: uuid.UUID, **values: Any) -> None:
    """Count one poll of the attempt and set `values` (its next poll, its query error streak)."""
    conn.execute(task_attempts.update().where(_a.id == attempt_id).values(poll_count=_a.poll_count + 1, **values))


def due_lookups(conn: Connection, now: datetime, limit: int, task_id: uuid.UUID | None = None) -> list[DueLookup]:
    """UNKNOWN attempts of unparked tasks whose next action is due (or unset), of `task_id` when given."""
    stmt = (
        sa.select(_a.id, _a.task_id)
        .join(generation_tasks, _t.id == _a.task_id)
        .where(
            _a.submit_state == AttemptStatus.UNKNOWN.value,
            sa.or_(_t.next_action_at.is_(None), _t.next_action_at <= now),
            _t.parked_reason.is_(None),
        )
        .limit(limit)
    )
    if task_id is not None:
        stmt = stmt.where(_a.task_id == task_id)
    return [DueLookup(r.id, r.task_id) for r in conn.execute(stmt).all()]


def count_lookup(conn: Connection, attempt_id: uuid.UUID, now: datetime, *, not_found: bool) -> None:
    """One more lookup of the attempt, at `now`; `not_found`: the provider said it has no such job."""
    values: dict[str, Any] = {"lookup_count": _a.lookup_count + 1, "last_lookup_at": now}
    if not_found:
        values["last_not_found_at"] = now
    conn.execute(task_attempts.update().where(_a.id == attempt_id).values(**values))


def owned_job_ids(conn: Connection, provider: str, job_ids: Sequence[str]) -> set[str]:
    """Those of `job_ids` that an attempt of ours at `provider` already owns (no query for none)."""
    if not job_ids:
        return set()
    return set(
        conn.execute(
            sa.select(_a.provider_job_id).where(_a.provider == provider, _a.provider_job_id.in_(job_ids))
        ).scalars()
    )


def rivals(
    conn: Connection,
    attempt_id: uuid.UUID,
    provider: str,
    fingerprint: bytes,
    sent_between: tuple[datetime, datetime],
) -> list[Rival]:
    """Our other attempts at `provider` with this request fingerprint, sent (or created) within `sent_between`,
    still SENDING or UNKNOWN and without a job id."""
    rows = conn.execute(
        sa.select(_a.id, _a.submit_state).where(
            _a.provider == provider,
            _a.request_fingerprint == fingerprint,
            _a.id != attempt_id,
            _a.provider_job_id.is_(None),
            _a.submit_state.in_((AttemptStatus.SENDING.value, AttemptStatus.UNKNOWN.value)),
            sa.func.coalesce(_a.submitted_at, _a.created_at).between(*sent_between),
        )
    ).all()
    return [Rival(r.id, r.submit_state) for r in rows]


def cancels_due(conn: Connection, now: datetime, limit: int) -> list[uuid.UUID]:
    """CANCEL_REQUESTED tasks whose next action is due (or unset)."""
    rows = conn.execute(
        sa.select(_t.id)
        .where(
            _t.status == TaskStatus.CANCEL_REQUESTED.value,
            sa.or_(_t.next_action_at.is_(None), _t.next_action_at <= now),
        )
        .limit(limit)
    ).all()
    return [r.id for r in rows]
