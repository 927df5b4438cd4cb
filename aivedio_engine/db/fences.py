"""The fence statements of the slot reconciler (`slots.reconcile`) and of degraded dispatch (`db.degraded`): the
in-flight attempts the slot store is rebuilt from, the fence floor, the `fencing_token_seq` high-water mark, and
raising re-created leases' fences on their attempts.

The sequence is a durable high-water mark, not a fence generator while the store is up (see `slots.reconcile`
for why): advanced only upwards under an advisory lock, read back by `fence_floor`. SQLite has no sequence; there
the floor is the largest fence recorded on an attempt.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.admission import scope_names
from aivedio_engine.domain.status import ATTEMPT_IN_FLIGHT
from aivedio_engine.slots.base import Lease

FENCE_SEQUENCE = "fencing_token_seq"
#: serializes high-water updates across reconcilers ("aivedio" + 1; migrate uses + 0)
_HIGH_WATER_LOCK = 0x61697665_64696F01


def in_flight_by_scope(conn: Connection) -> dict[str, list[str]]:
    """scope → attempt ids in flight in it, over the four nested scopes of each attempt."""
    ta, gt = task_attempts.c, generation_tasks.c
    rows = conn.execute(
        sa.select(ta.id, ta.provider, ta.model, gt.tenant_id)
        .join_from(task_attempts, generation_tasks, ta.task_id == gt.id)
        .where(ta.submit_state.in_(sorted(s.value for s in ATTEMPT_IN_FLIGHT)))
        .order_by(ta.id)
    )
    active: dict[str, list[str]] = {}
    for attempt_id, provider, model, tenant_id in rows:
        for scope in scope_names(str(tenant_id), provider, model):
            active.setdefault(scope, []).append(str(attempt_id))
    return active


def fence_floor(conn: Connection) -> int:
    """The largest fence the database knows of: attempts and (PostgreSQL) the high-water sequence."""
    best = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(task_attempts.c.fencing_token), 0))).scalar_one())
    if conn.dialect.name == "postgresql":
        last, called = conn.execute(sa.text(f"SELECT last_value, is_called FROM {FENCE_SEQUENCE}")).one()
        best = max(best, int(last) if called else int(last) - 1)
    return best


def record_high_water(conn: Connection, fence: int) -> int:
    """Advance the sequence to `fence` if it is behind (PostgreSQL); returns the recorded high-water mark."""
    if conn.dialect.name != "postgresql":
        return fence_floor(conn)
    # setval is not transactional and two reconcilers could interleave read-compare-set, lowering the mark
    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_HIGH_WATER_LOCK)))
    last, called = conn.execute(sa.text(f"SELECT last_value, is_called FROM {FENCE_SEQUENCE}")).one()
    current = int(last) if called else 0
    if fence > current:
        conn.execute(sa.select(sa.func.setval(FENCE_SEQUENCE, fence, True)))
        return fence
    return current


def raise_fences(conn: Connection, leases: Sequence[Lease]) -> int:
    """Give each re-created lease's attempt the new fence, only upwards and only while it is in flight."""
    ta = task_attempts.c
    changed = 0
    for lease in leases:
        result = conn.execute(
            sa.update(task_attempts)
            .where(ta.id == uuid.UUID(lease.holder))
            .where(ta.submit_state.in_(sorted(s.value for s in ATTEMPT_IN_FLIGHT)))
            .where(sa.or_(ta.fencing_token.is_(None), ta.fencing_token < lease.fence))
            .values(fencing_token=lease.fence)
        )
        changed += result.rowcount or 0
    return changed
