"""The fair scheduler's read of what waits: queued tasks whose next action is due, oldest first, with their
tenant's tier and concurrency cap (services.dispatch turns them into admission candidates). A plain read on its own
connection: the claim that follows locks the one task it picks."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import generation_tasks, tenants
from aivedio_engine.domain.status import TaskStatus

_t = generation_tasks.c


@dataclass(frozen=True, slots=True)
class QueuedTask:
    id: uuid.UUID
    tenant_id: uuid.UUID
    selected_provider: str | None
    requested_model: str
    created_at: datetime
    priority: int
    priority_tier: int  # the tenant's
    max_concurrency: int | None  # the tenant's cap; None: the default


def due(conn: Connection, now: datetime, limit: int) -> list[QueuedTask]:
    """At most `limit` QUEUED tasks without a future next_action_at, oldest first."""
    stmt = (
        sa.select(
            _t.id,
            _t.tenant_id,
            _t.selected_provider,
            _t.requested_model,
            _t.created_at,
            _t.priority,
            tenants.c.priority_tier,
            tenants.c.max_concurrency,
        )
        .join(tenants, tenants.c.id == _t.tenant_id)
        .where(_t.status == TaskStatus.QUEUED.value, sa.or_(_t.next_action_at.is_(None), _t.next_action_at <= now))
        .order_by(_t.created_at)
        .limit(limit)
    )
    return [QueuedTask(*row) for row in conn.execute(stmt)]
