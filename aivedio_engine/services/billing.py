"""Closing a task's credit reservation, by the effect the state machine asked for (DESIGN §4, §11).

Sign convention: RESERVE −estimate; SETTLE +(estimate − actual); RELEASE +estimate. Business keys make every
booking happen at most once, however often a closing transition's consumer is redelivered.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db import ledger
from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.status import AttemptStatus, LedgerEntryType
from aivedio_engine.domain.transitions import Decision, Effect

#: attempts the provider accepted: under the usual vendor rule these are billed even when they fail later
_ACCEPTED = (
    AttemptStatus.ACKED.value,
    AttemptStatus.RUNNING.value,
    AttemptStatus.SUCCEEDED.value,
    AttemptStatus.FAILED.value,
    AttemptStatus.CANCELED.value,
    AttemptStatus.UNKNOWN.value,
)


def close_reservation(
    conn: Connection,
    task: Any,
    decision: Decision,
    now: datetime,
    *,
    reason: str,
    billed: bool | None = None,
    created_by: str = "engine",
) -> Decimal | None:
    """Book SETTLE or RELEASE for a closing transition; returns the actual cost booked (None if nothing)."""
    reserved = Decimal(task.reserved_amount or 0)
    if reserved == 0:
        return None
    if Effect.RELEASE_CREDITS in decision.effects:
        actual = Decimal(0)
    elif Effect.SETTLE_CREDITS in decision.effects:
        actual = Decimal(task.estimated_cost)
    elif Effect.SETTLE_PER_BILLING_RULE in decision.effects:
        actual = Decimal(task.estimated_cost) if _was_billed(conn, task.id, billed) else Decimal(0)
    else:
        return None
    if actual == 0:
        ledger.post(
            conn,
            tenant_id=task.tenant_id,
            task_id=task.id,
            entry_type=LedgerEntryType.RELEASE,
            amount=reserved,
            business_key=f"release:{task.id}:{reason}",
            now=now,
            created_by=created_by,
            reason=reason,
        )
    else:
        ledger.post(
            conn,
            tenant_id=task.tenant_id,
            task_id=task.id,
            entry_type=LedgerEntryType.SETTLE,
            amount=reserved - actual,
            business_key=f"settle:{task.id}",
            now=now,
            created_by=created_by,
            reason=reason,
        )
    conn.execute(
        generation_tasks.update().where(generation_tasks.c.id == task.id).values(reserved_amount=0, actual_cost=actual)
    )
    return actual


def _was_billed(conn: Connection, task_id: Any, billed: bool | None) -> bool:
    """The provider's verdict when it gave one; otherwise billed iff some attempt was accepted by it."""
    if billed is not None:
        return billed
    accepted = conn.execute(
        sa.select(sa.func.count())
        .select_from(task_attempts)
        .where(task_attempts.c.task_id == task_id, task_attempts.c.submit_state.in_(_ACCEPTED))
    ).scalar_one()
    return accepted > 0
