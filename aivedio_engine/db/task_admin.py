"""The operator's reads of generation tasks across tenants (services.task_ops, `aivedio tasks ...`): the
filtered list and its count, a tenant named by name, and the state-event tail."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Row

from aivedio_engine.db.tables import generation_tasks, task_state_events, tenants

_t = generation_tasks.c
_e = task_state_events.c


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: uuid.UUID
    tenant_id: uuid.UUID
    tenant: str
    status: str
    version: int
    model: str
    provider: str | None
    attempts: int
    progress: int
    parked_reason: str | None
    last_error_class: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks an operator's list or count is about; None = any."""

    status: str | None = None
    provider: str | None = None
    #: only tasks whose `updated_at` is at or before this
    updated_before: datetime | None = None
    tenant_id: uuid.UUID | None = None


def list_tasks(
    conn: Connection, where: TaskFilter, *, id_range: tuple[uuid.UUID, uuid.UUID] | None, limit: int
) -> list[TaskRow]:
    """Most recently changed first; `id_range` bounds the id (a prefix an operator typed)."""
    stmt = _filtered(
        sa.select(generation_tasks, tenants.c.name.label("tenant_name")).join(tenants, tenants.c.id == _t.tenant_id),
        where,
    )
    if id_range is not None:
        stmt = stmt.where(_t.id.between(*id_range))
    rows = conn.execute(stmt.order_by(_t.updated_at.desc(), _t.id.desc()).limit(limit)).all()
    return [
        TaskRow(
            task_id=r.id,
            tenant_id=r.tenant_id,
            tenant=r.tenant_name,
            status=r.status,
            version=int(r.version),
            model=r.requested_model,
            provider=r.selected_provider,
            attempts=int(r.current_attempt_no),
            progress=int(r.progress),
            parked_reason=r.parked_reason,
            last_error_class=r.last_error_class,
            created_at=r.created_at,
            updated_at=r.updated_at,
        )
        for r in rows
    ]


def count_tasks(conn: Connection, where: TaskFilter) -> int:
    return int(conn.execute(_filtered(sa.select(sa.func.count()).select_from(generation_tasks), where)).scalar_one())


def tenant_id_by_name(conn: Connection, name: str) -> uuid.UUID | None:
    found: uuid.UUID | None = conn.execute(sa.select(tenants.c.id).where(tenants.c.name == name)).scalar()
    return found


def newest_events(conn: Connection, to_status: str | None, last: int) -> list[Row[Any]]:
    """The newest `last` state events (into `to_status`), newest first."""
    return list(conn.execute(_events(to_status).order_by(_e.id.desc()).limit(last)).all())


def newest_event_id(conn: Connection) -> uuid.UUID | None:
    # PostgreSQL has no max(uuid)
    found: uuid.UUID | None = conn.execute(sa.select(_e.id).order_by(_e.id.desc()).limit(1)).scalar()
    return found


def events_after(conn: Connection, to_status: str | None, floor: uuid.UUID | None, limit: int) -> list[Row[Any]]:
    """State events (into `to_status`) with an id above `floor`, oldest first."""
    stmt = _events(to_status)
    if floor is not None:
        stmt = stmt.where(_e.id > floor)
    return list(conn.execute(stmt.order_by(_e.id).limit(limit)).all())


def _events(to_status: str | None) -> sa.Select[Any]:
    stmt = sa.select(task_state_events)
    if to_status is not None:
        stmt = stmt.where(_e.to_status == to_status)
    return stmt


def _filtered(stmt: sa.Select[Any], where: TaskFilter) -> sa.Select[Any]:
    if where.status is not None:
        stmt = stmt.where(_t.status == where.status)
    if where.provider is not None:
        stmt = stmt.where(_t.selected_provider == where.provider)
    if where.updated_before is not None:
        stmt = stmt.where(_t.updated_at <= where.updated_before)
    if where.tenant_id is not None:
        stmt = stmt.where(_t.tenant_id == where.tenant_id)
    return stmt
