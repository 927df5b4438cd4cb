"""Task persistence: CAS status updates and the append-only state event history.

Every applied transition is `UPDATE ... WHERE id = ? AND version = ?` plus one task_state_events row in the
same transaction; a version conflict means someone else moved the task first, and the caller re-reads and
re-decides. Ignored observations are recorded too, with their outcome, so the timeline explains everything.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db import outbox
from aivedio_engine.db.tables import generation_tasks, task_state_events
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import EventSource, StateEventOutcome, TaskStatus
from aivedio_engine.domain.transitions import Decision, Effect, TaskEvent, TaskSnapshot, Trigger, decide

_t = generation_tasks.c


class VersionConflict(Exception):
    """The task moved since it was read; re-read and decide again."""


def snapshot(row: Any) -> TaskSnapshot:
    return TaskSnapshot(TaskStatus(row.status), int(row.version), int(row.progress), row.deadline_at)


def read(conn: Connection, task_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *, lock: bool = False) -> Any:
    stmt = sa.select(generation_tasks).where(_t.id == task_id)
    if tenant_id is not None:
        stmt = stmt.where(_t.tenant_id == tenant_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return conn.execute(stmt).first()


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
        id=new_id(), task_id=task_id, attempt_id=attempt_id, source=source.value, source_event_id=source_event_id,
        event_type=event_type, from_status=from_status, to_status=to_status, task_version=task_version,
        provider_updated_at=provider_updated_at, observed_at=now, payload=payload, outcome=outcome.value,
        created_at=now,
    )


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
    row = conn.execute(
        generation_tasks.update().where(_t.id == task_id, _t.version == decision.version - 1).values(**values)
        .returning(_t.tenant_id, _t.trace_id)
    ).first()
    if row is None:
        raise VersionConflict(f"task {task_id} is no longer at version {decision.version - 1}")
    if Effect.NOTIFY in decision.effects:
        # the notifier's trigger; subscribers read the change itself from the state event history
        outbox.add(conn, EventType.TASK_STATUS_CHANGED, aggregate_type="task", aggregate_id=task_id,
                   aggregate_version=decision.version, tenant_id=row.tenant_id, trace_id=row.trace_id, now=now,
                   payload={"task_id": str(task_id), "version": decision.version,
                            "status": decision.to_status.value, "progress": decision.progress})
    record_event(
        conn, task_id=task_id, source=source, source_event_id=source_event_id, event_type=decision.event.value,
        from_status=decision.from_status.value, to_status=decision.to_status.value, task_version=decision.version,
        outcome=StateEventOutcome.APPLIED, now=now, payload=payload,
    )


def decide_and_apply(conn: Connection, task: Any, event: TaskEvent, now: datetime, *, source: EventSource,
                     payload: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Decision:
    """Decide `event` for the task row just read (under its lock) and apply it; a rejection means the caller's
    view is out of date, so it surfaces as VersionConflict (the caller's transaction rolls back)."""
    decision = decide(snapshot(task), Trigger(event, expected_version=int(task.version)), now)
    if not isinstance(decision, Decision):
        raise VersionConflict(f"{event} rejected for task {task.id}: {decision.reason}")
    apply(conn, task.id, decision, source=source, source_event_id=f"{task.id}:{decision.version}", now=now,
          extra=extra, payload=payload)
    return decision
