"""System B step queues in the database: the wake-up messages of due steps, and the counts the claim-time limits
need.

A due step is announced by a `workflow.step.due` outbox row routed to its queue's actor, written in the
transaction that made it due; the relay publishes it after the commit. The step row stays the truth: the message
only says "look at this queue", and the consumer claims the best due step there.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db import outbox
from aivedio_engine.db.tables import workflow_tasks
from aivedio_engine.domain.events import STEP_ROUTES, EventType
from aivedio_engine.domain.workflow import QueueName, StepStatus, StepType

_w = workflow_tasks.c
_DUE = (StepStatus.PENDING.value, StepStatus.RETRYING.value)


@dataclass(frozen=True, slots=True)
class DueStep:
    """What a wake-up names: the step, its row version, its queue and project."""

    id: uuid.UUID
    version: int
    queue: str
    project_id: uuid.UUID
    next_attempt_at: datetime | None


def announce(conn: Connection, s: Any, now: datetime, at: datetime | None = None) -> None:
    """Write the wake-up of step `s`'s queue in the caller's transaction, available at `at` (a retry's due time) or
    now. It names the step, but its consumer claims the best due step of the queue: a duplicate or late message
    costs one claim query and nothing else."""
    outbox.add(
        conn,
        EventType.STEP_DUE,
        aggregate_type="workflow_task",
        aggregate_id=s.id,
        aggregate_version=s.version,
        payload={"queue": s.queue, "step_id": str(s.id), "project_id": str(s.project_id)},
        now=now,
        available_at=max(at, now) if at is not None else now,
        route=STEP_ROUTES[QueueName(s.queue)],
    )


def _due(now: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(_w.status.in_(_DUE), sa.or_(_w.next_attempt_at.is_(None), _w.next_attempt_at <= now))


_COLUMNS = (_w.id, _w.version, _w.queue, _w.project_id, _w.next_attempt_at)
_ORDER = (_w.priority, _w.next_attempt_at, _w.id)


def first_due(conn: Connection, queue: str, now: datetime) -> DueStep | None:
    """The step a claim of `queue` looks at first (best priority, then longest due)."""
    row = conn.execute(sa.select(*_COLUMNS).where(_w.queue == queue, _due(now)).order_by(*_ORDER).limit(1)).first()
    return DueStep(*row) if row else None


def due_of_project(conn: Connection, project_id: uuid.UUID, now: datetime) -> list[DueStep]:
    rows = conn.execute(sa.select(*_COLUMNS).where(_w.project_id == project_id, _due(now)).order_by(*_ORDER))
    return [DueStep(*r) for r in rows]


def queues_due_before(conn: Connection, before: datetime) -> list[str]:
    """Queues holding a step due since before `before`: a wake-up that never came, or one spent while the step
    had to wait (`ix_workflow_tasks_due`)."""
    return sorted(r.queue for r in conn.execute(sa.select(_w.queue).where(_due(before)).distinct()))


def lock_queues(conn: Connection, queues: list[str]) -> None:
    """Serialize the claims of capped queues until commit (PostgreSQL advisory locks, taken in name order so two
    claimers never wait on each other crosswise); SQLite serializes every writer anyway."""
    if conn.dialect.name != "postgresql":
        return
    for q in sorted(queues):
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(f"aivedio:step_queue:{q}"))))


def running_types_of_project(conn: Connection, project_id: uuid.UUID) -> list[StepType]:
    rows = conn.execute(
        sa.select(_w.task_type).where(_w.project_id == project_id, _w.status == StepStatus.RUNNING.value)
    )
    return [StepType(r.task_type) for r in rows]


def running_in_queue(conn: Connection, queue: str) -> int:
    stmt = sa.select(sa.func.count()).where(_w.queue == queue, _w.status == StepStatus.RUNNING.value)
    return int(conn.execute(stmt).scalar_one())


def running_by_project(conn: Connection, types: list[StepType]) -> list[tuple[uuid.UUID, StepType, int]]:
    """(project, type, running steps) for these step types: which projects are at a per-project limit."""
    rows = conn.execute(
        sa.select(_w.project_id, _w.task_type, sa.func.count())
        .where(_w.status == StepStatus.RUNNING.value, _w.task_type.in_([t.value for t in types]))
        .group_by(_w.project_id, _w.task_type)
    )
    return [(pid, StepType(t), int(n)) for pid, t, n in rows]
