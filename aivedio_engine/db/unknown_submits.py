"""Ambiguous submits (an attempt in SUBMIT_UNKNOWN) as `aivedio reconcile` reads them: the attempts waiting for a
lookup, and what a task and its attempt look like after one (services/reconcile_ops.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import alerts, generation_tasks, task_attempts
from aivedio_engine.domain.status import AlertStatus, AttemptStatus

_a = task_attempts.c
_t = generation_tasks.c


@dataclass(frozen=True, slots=True)
class UnknownSubmit:
    """A task's attempt whose submit is UNKNOWN, with what the task says about it."""

    task_id: uuid.UUID
    tenant_id: uuid.UUID
    attempt_id: uuid.UUID
    provider: str
    task_status: str
    #: when the ambiguous request was sent (the attempt's creation when no send time was recorded)
    sent_at: datetime
    lookup_count: int
    last_lookup_at: datetime | None
    next_action_at: datetime | None
    parked_reason: str | None


@dataclass(frozen=True, slots=True)
class AfterLookup:
    """A task and one of its attempts as they are now; None fields: the task (task_status) or the attempt
    (provider) is not there."""

    task_status: str | None
    parked_reason: str | None
    next_action_at: datetime | None
    provider: str | None
    provider_job_id: str | None
    #: rules of the alerts about the task or the attempt that are not resolved, sorted
    open_alerts: list[str]


def _sent_at() -> Any:
    return sa.func.coalesce(_a.submitted_at, _a.created_at)


def _unknown() -> Any:
    return (
        sa.select(
            _a.task_id,
            _t.tenant_id,
            _a.id.label("attempt_id"),
            _a.provider,
            _t.status.label("task_status"),
            _sent_at().label("sent_at"),
            _a.lookup_count,
            _a.last_lookup_at,
            _t.next_action_at,
            _t.parked_reason,
        )
        .join(generation_tasks, _t.id == _a.task_id)
        .where(_a.submit_state == AttemptStatus.UNKNOWN.value)
    )


def _record(r: Any) -> UnknownSubmit:
    return UnknownSubmit(
        task_id=r.task_id,
        tenant_id=r.tenant_id,
        attempt_id=r.attempt_id,
        provider=r.provider,
        task_status=r.task_status,
        sent_at=r.sent_at,
        lookup_count=int(r.lookup_count),
        last_lookup_at=r.last_lookup_at,
        next_action_at=r.next_action_at,
        parked_reason=r.parked_reason,
    )


def unknown_submits(
    conn: Connection,
    *,
    limit: int,
    among: Sequence[uuid.UUID] | None = None,
    provider: str | None = None,
    sent_before: datetime | None = None,
    task_id: uuid.UUID | None = None,
) -> list[UnknownSubmit]:
    """UNKNOWN attempts, parked ones included, oldest send first, narrowed by whichever filters are given."""
    stmt = _unknown()
    if among is not None:
        stmt = stmt.where(_a.task_id.in_(list(among)))
    if provider is not None:
        stmt = stmt.where(_a.provider == provider)
    if sent_before is not None:
        stmt = stmt.where(_sent_at() <= sent_before)
    if task_id is not None:
        stmt = stmt.where(_a.task_id == task_id)
    return [_record(r) for r in conn.execute(stmt.order_by(_sent_at(), _a.id).limit(limit)).all()]


def unknown_submit(conn: Connection, task_id: uuid.UUID) -> UnknownSubmit | None:
    """The task's UNKNOWN attempt, or None when it has none."""
    row = conn.execute(_unknown().where(_a.task_id == task_id)).first()
    return None if row is None else _record(row)


def task_status(conn: Connection, task_id: uuid.UUID) -> str | None:
    """The task's status; None when there is no such task."""
    status: str | None = conn.execute(sa.select(_t.status).where(_t.id == task_id)).scalar()
    return status


def unpark(conn: Connection, task_ids: Sequence[uuid.UUID]) -> None:
    """Clear the parked reason of those of these tasks that have one."""
    conn.execute(
        generation_tasks.update().where(_t.id.in_(task_ids), _t.parked_reason.is_not(None)).values(parked_reason=None)
    )


def after_lookup(conn: Connection, task_id: uuid.UUID, attempt_id: uuid.UUID | None) -> AfterLookup:
    task = conn.execute(sa.select(generation_tasks).where(_t.id == task_id)).first()
    attempt = conn.execute(sa.select(task_attempts).where(_a.id == attempt_id)).first() if attempt_id else None
    subjects = [str(task_id)] + ([str(attempt_id)] if attempt_id else [])
    open_rules = sorted(
        set(
            conn.execute(
                sa.select(alerts.c.rule).where(
                    alerts.c.subject_id.in_(subjects), alerts.c.status != AlertStatus.RESOLVED.value
                )
            ).scalars()
        )
    )
    return AfterLookup(
        task_status=task.status if task is not None else None,
        parked_reason=task.parked_reason if task is not None else None,
        next_action_at=task.next_action_at if task is not None else None,
        provider=attempt.provider if attempt is not None else None,
        provider_job_id=attempt.provider_job_id if attempt is not None else None,
        open_alerts=open_rules,
    )


@dataclass(frozen=True, slots=True)
class JobHolder:
    task_id: uuid.UUID
    attempt_id: uuid.UUID


def job_holder(conn: Connection, provider: str, job_id: str) -> JobHolder | None:
    """The attempt that holds `job_id` at `provider` (one job belongs to one attempt), or None."""
    row = conn.execute(
        sa.select(_a.task_id, _a.id).where(_a.provider == provider, _a.provider_job_id == job_id)
    ).first()
    return None if row is None else JobHolder(task_id=row.task_id, attempt_id=row.id)
