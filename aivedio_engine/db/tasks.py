"""Task persistence: CAS status updates and the append-only state event history.

Every applied transition is `UPDATE ... WHERE id = ? AND version = ?` plus one task_state_events row in the
same transaction; a version conflict means someone else moved the task first, and the caller re-reads and
re-decides. Ignored observations are recorded too, with their outcome, so the timeline explains everything.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db import lock_order, outbox, wakeup
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import run_prebuilt
from aivedio_engine.db.tables import generation_tasks, outbox_events, task_state_events
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.retry import LastError, last_error_value
from aivedio_engine.domain.status import EventSource, StateEventOutcome, TaskStatus
from aivedio_engine.domain.transitions import Decision, Effect, TaskSnapshot

_t = generation_tasks.c
_e = task_state_events.c


class VersionConflict(Exception):
    """The task moved since it was read; re-read and decide again."""


def snapshot(row: Task) -> TaskSnapshot:
    return TaskSnapshot(TaskStatus(row.status), int(row.version), int(row.progress), row.deadline_at)


@dataclass(frozen=True, slots=True)
class AppliedChange:
    """One applied transition of the history, as a status stream shows it."""

    to_status: str | None
    task_version: int
    payload: dict[str, Any] | None
    created_at: datetime


def applied_history(conn: Connection, task_id: uuid.UUID, after_version: int | None = None) -> list[AppliedChange]:
    """The task's applied transitions after `after_version` (all of them for None), oldest first."""
    stmt = (
        sa.select(_e.to_status, _e.task_version, _e.payload, _e.created_at)
        .where(_e.task_id == task_id, _e.outcome == StateEventOutcome.APPLIED.value)
        .order_by(_e.task_version)
    )
    if after_version is not None:
        stmt = stmt.where(_e.task_version > after_version)
    return [
        AppliedChange(to_status=r.to_status, task_version=r.task_version, payload=r.payload, created_at=r.created_at)
        for r in conn.execute(stmt)
    ]


def read(
    conn: Connection, task_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *, lock: bool = False
) -> Task | None:
    stmt = sa.select(generation_tasks).where(_t.id == task_id)
    if tenant_id is not None:
        stmt = stmt.where(_t.tenant_id == tenant_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
        row = conn.execute(stmt).first()
        if row is not None:
            lock_order.note_task_locked(conn, row.id)
        return Task.of(row)
    return Task.of(conn.execute(stmt).first())


def get(conn: Connection, task_id: uuid.UUID, *, lock: bool = False) -> Task:
    """`read` of a task that must exist (one named by an attempt, an asset or a message written with it)."""
    task = read(conn, task_id, lock=lock)
    if task is None:
        raise LookupError(f"task {task_id} does not exist")
    return task


def page(
    conn: Connection, tenant_id: uuid.UUID, status: str | None, cursor: uuid.UUID | None, limit: int
) -> list[Task]:
    """Up to `limit` of the tenant's tasks, newest first, below `cursor` (keyset on the time-ordered id)."""
    stmt = sa.select(generation_tasks).where(_t.tenant_id == tenant_id)
    if status is not None:
        stmt = stmt.where(_t.status == status)
    if cursor is not None:
        stmt = stmt.where(_t.id < cursor)
    return [Task(*r) for r in conn.execute(stmt.order_by(_t.id.desc()).limit(limit))]


def mark_ready(conn: Connection, task_id: uuid.UUID, version: int, now: datetime) -> bool:
    """`next_action_at = now` on a task still QUEUED at `version`; the guard is in the UPDATE, so a concurrent
    cancel is never overwritten. False: the task moved on (or is gone)."""
    updated = conn.execute(
        sa.update(generation_tasks)
        .where(_t.id == task_id, _t.status == TaskStatus.QUEUED.value, _t.version == version)
        .values(next_action_at=now)
    ).rowcount
    return bool(updated)


@dataclass(frozen=True, slots=True)
class StatusVersion:
    status: str
    version: int


@dataclass(frozen=True, slots=True)
class TaskOwner:
    tenant_id: uuid.UUID
    trace_id: str | None


def status_version(conn: Connection, task_id: uuid.UUID) -> StatusVersion | None:
    """The task's status and version (None: no such task)."""
    row = conn.execute(sa.select(_t.status, _t.version).where(_t.id == task_id)).first()
    return None if row is None else StatusVersion(*row)


def tenant_and_trace(conn: Connection, task_id: uuid.UUID) -> TaskOwner | None:
    """The task's tenant_id and trace_id (None: no such task)."""
    row = conn.execute(sa.select(_t.tenant_id, _t.trace_id).where(_t.id == task_id)).first()
    return None if row is None else TaskOwner(*row)


def event_row(
    *,
    task_id: uuid.UUID,
    source: EventSource,
    source_event_id: str,
    event_type: str,
    from_status: str | None,
    to_status: str | None,
    task_version: int,
    outcome: StateEventOutcome,
    now: datetime,
    attempt_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
    provider_updated_at: datetime | None = None,
) -> dict[str, Any]:
    return dict(
        id=new_id(),
        task_id=task_id,
        attempt_id=attempt_id,
        source=source.value,
        source_event_id=source_event_id,
        event_type=event_type,
        from_status=from_status,
        to_status=to_status,
        task_version=task_version,
        provider_updated_at=provider_updated_at,
        observed_at=now,
        payload=payload,
        outcome=outcome.value,
        created_at=now,
    )


def status_changed_payload(task_id: uuid.UUID, version: int, status: str, progress: int) -> dict[str, Any]:
    """The `task.status.changed` payload: a trigger only; subscribers read the change from the history."""
    return {"task_id": str(task_id), "version": version, "status": status, "progress": progress}


def record_event(conn: Connection, **fields: Any) -> None:
    conn.execute(task_state_events.insert().values(**event_row(**fields)))


def record_events(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Several history rows in one statement (one round trip)."""
    conn.execute(task_state_events.insert(), rows)


def apply(
    conn: Connection,
    task_id: uuid.UUID,
    decision: Decision,
    *,
    source: EventSource,
    source_event_id: str,
    now: datetime,
    extra: dict[str, Any] | None = None,
    payload: dict[str, Any] | None = None,
) -> None:
    """CAS-update the task to `decision` and append its state event; raises VersionConflict."""
    values: dict[str, Any] = {
        "status": decision.to_status.value,
        "version": decision.version,
        "progress": decision.progress,
        "updated_at": now,
        **(extra or {}),
    }
    if decision.finished:
        values.setdefault("finished_at", now)
    if decision.cancel_outcome is not None:
        values.setdefault("cancel_outcome", decision.cancel_outcome.value)
    event = event_row(
        task_id=task_id,
        source=source,
        source_event_id=source_event_id,
        event_type=decision.event.value,
        from_status=decision.from_status.value,
        to_status=decision.to_status.value,
        task_version=decision.version,
        outcome=StateEventOutcome.APPLIED,
        now=now,
        payload=payload,
    )
    if conn.dialect.name == "postgresql":
        _apply_one_statement(conn, task_id, decision, values, event, now)
        return
    row = conn.execute(
        generation_tasks.update()
        .where(_t.id == task_id, _t.version == decision.version - 1)
        .values(**values)
        .returning(_t.tenant_id, _t.trace_id)
    ).first()
    if row is None:
        raise VersionConflict(f"task {task_id} is no longer at version {decision.version - 1}")
    if Effect.NOTIFY in decision.effects:
        # the notifier's trigger; subscribers read the change itself from the state event history
        outbox.add(
            conn,
            EventType.TASK_STATUS_CHANGED,
            aggregate_type="task",
            aggregate_id=task_id,
            aggregate_version=decision.version,
            tenant_id=row.tenant_id,
            trace_id=row.trace_id,
            now=now,
            payload=status_changed_payload(task_id, decision.version, decision.to_status.value, decision.progress),
        )
    conn.execute(task_state_events.insert().values(**event))


def _apply_one_statement(
    conn: Connection,
    task_id: uuid.UUID,
    decision: Decision,
    values: dict[str, Any],
    event: dict[str, Any],
    now: datetime,
) -> None:
    """PostgreSQL: the CAS update, its state event and its `task.status.changed` row as one statement (data-
    modifying CTEs), so a transition costs one round trip instead of three. The inserts select from the UPDATE's
    RETURNING: when the CAS misses, nothing is inserted and the caller gets VersionConflict."""
    notice = None
    if Effect.NOTIFY in decision.effects:
        notice = outbox.row(
            EventType.TASK_STATUS_CHANGED,
            aggregate_type="task",
            aggregate_id=task_id,
            aggregate_version=decision.version,
            now=now,
            payload=status_changed_payload(task_id, decision.version, decision.to_status.value, decision.progress),
        )
        notice = {c: v for c, v in notice.items() if c not in _FROM_MOVED}
    stmt = _transition_statement(tuple(values), tuple(event), None if notice is None else tuple(notice))
    params = {"task_id": task_id, "expected_version": decision.version - 1}
    params.update({f"v_{c}": v for c, v in values.items()})
    params.update({f"e_{c}": v for c, v in event.items()})
    if notice is not None:
        params.update({f"n_{c}": v for c, v in notice.items()})
    if run_prebuilt(conn, stmt, params).fetchone() is None:
        raise VersionConflict(f"task {task_id} is no longer at version {decision.version - 1}")
    if notice is not None:
        wakeup.notify(conn, wakeup.OUTBOX)


#: the notice's columns taken from the moved task row
_FROM_MOVED = ("tenant_id", "trace_id")


@functools.cache
def _transition_statement(
    value_columns: tuple[str, ...], event_columns: tuple[str, ...], notice_columns: tuple[str, ...] | None
) -> Any:
    """The statement of `_apply_one_statement` for one shape of its rows, built once: per call, SQLAlchemy then only
    binds the values (the profile that asked for it: docs/decisions/0007-reducer-batches.md)."""
    moved = (
        generation_tasks.update()
        .where(_t.id == sa.bindparam("task_id"), _t.version == sa.bindparam("expected_version"))
        .values({c: sa.bindparam(f"v_{c}", type_=_t[c].type) for c in value_columns})
        .returning(_t.id, _t.tenant_id, _t.trace_id)
        .cte("moved")
    )
    ctes = [_insert_from(task_state_events, "e_", event_columns, moved, "history", {})]
    if notice_columns is not None:
        taken = {c: moved.c[c] for c in _FROM_MOVED}
        ctes.append(_insert_from(outbox_events, "n_", notice_columns, moved, "notice", taken))
    return sa.select(moved.c.id).add_cte(*ctes)


def _insert_from(
    table: sa.Table, prefix: str, columns: tuple[str, ...], moved: Any, name: str, taken: dict[str, Any]
) -> Any:
    exprs = [sa.bindparam(f"{prefix}{c}", type_=table.c[c].type) for c in columns] + list(taken.values())
    return table.insert().from_select([*columns, *taken], sa.select(*exprs).select_from(moved)).cte(name)


def set_error(conn: Connection, task_id: uuid.UUID, error: LastError, code: str, now: datetime) -> None:
    """Record why a step failed without moving the task (the step retries itself)."""
    conn.execute(
        generation_tasks.update()
        .where(_t.id == task_id)
        .values(last_error_class=last_error_value(error), last_error_code=code[:128], updated_at=now)
    )


def set_columns(conn: Connection, task_id: uuid.UUID, **values: Any) -> None:
    """Bookkeeping columns that are not part of a transition (next_action_at, progress, updated_at)."""
    if "status" in values or "version" in values or "last_error_class" in values:
        raise ValueError("status, version and errors change only through a transition (services.transition)")
    conn.execute(generation_tasks.update().where(_t.id == task_id).values(**values))
