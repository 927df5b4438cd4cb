"""What deciding a provider switch needs to know about tasks (`domain.provider_switch`), read in one query."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.status import AttemptStatus

_t = generation_tasks.c
_a = task_attempts.c
#: an attempt in these states may have created a job nobody has seen yet
_UNRESOLVED = (AttemptStatus.SENDING.value, AttemptStatus.UNKNOWN.value)


@dataclass(frozen=True, slots=True)
class SwitchFacts:
    task_id: uuid.UUID
    params: dict[str, Any]
    reserved: Decimal
    #: an attempt of the task is ambiguous (or still being sent) and not reconciled
    ambiguous_unresolved: bool


def facts(conn: Connection, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, SwitchFacts]:
    if not task_ids:
        return {}
    unresolved = sa.exists().where(_a.task_id == _t.id, _a.submit_state.in_(_UNRESOLVED)).correlate(generation_tasks)
    rows = conn.execute(
        sa.select(_t.id, _t.params, _t.reserved_amount, unresolved.label("unresolved")).where(_t.id.in_(task_ids))
    ).all()
    return {r.id: SwitchFacts(r.id, dict(r.params or {}), Decimal(r.reserved_amount), bool(r.unresolved)) for r in rows}
