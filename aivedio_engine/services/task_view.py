"""What the API and the CLI show of a task (`TaskView`), and the answer of a create (`Created`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the view is imported by light modules; the record pulls in the db package
    from aivedio_engine.db.records import Task


@dataclass(frozen=True, slots=True)
class TaskView:
    id: uuid.UUID
    tenant_id: uuid.UUID
    status: str
    version: int
    progress: int
    model: str
    provider: str | None
    priority: int
    estimated_cost: Decimal
    reserved_amount: Decimal
    actual_cost: Decimal | None
    params: dict[str, Any]
    cancel_outcome: str | None
    last_error_class: str | None
    parked_reason: str | None
    deadline_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, row: Task) -> TaskView:
        return cls(
            id=row.id,
            tenant_id=row.tenant_id,
            status=row.status,
            version=int(row.version),
            progress=int(row.progress),
            model=row.requested_model,
            provider=row.selected_provider,
            priority=row.priority,
            estimated_cost=row.estimated_cost,
            reserved_amount=row.reserved_amount,
            actual_cost=row.actual_cost,
            params=row.params,
            cancel_outcome=row.cancel_outcome,
            last_error_class=row.last_error_class,
            parked_reason=row.parked_reason,
            deadline_at=row.deadline_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            finished_at=row.finished_at,
        )


@dataclass(frozen=True, slots=True)
class Created:
    task: TaskView
    replayed: bool
