"""The reads and the fence source the dispatcher degrades to: Redis down, fetch pressure.

With the slot store unreachable, the in-flight attempts in PostgreSQL are the counts (they are the truth the
store is rebuilt from anyway), fences come from the `fencing_token_seq` high-water sequence, and one advisory
lock makes the degraded rounds of several schedulers take turns, since no store arbitrates between them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.db.fences import FENCE_SEQUENCE, fence_floor, in_flight_by_scope
from aivedio_engine.db.tables import generation_tasks, task_attempts
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.slots.base import DEFAULT_RESEED_GAP

#: "aivedio" + 2 (migrate uses + 0, the slot high-water mark + 1)
_DEGRADED_ROUND_LOCK = 0x61697665_64696F02


def in_flight_counts(engine: Engine) -> dict[str, int]:
    """Attempts in flight per admission scope, as the slot store would count them."""
    with engine.connect() as conn:
        return {scope: len(holders) for scope, holders in in_flight_by_scope(conn).items()}


@contextmanager
def round_lock(engine: Engine) -> Iterator[bool]:
    """True while this process holds the degraded-dispatch lock (PostgreSQL); SQLite has one process anyway."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    with engine.connect() as conn:
        got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(_DEGRADED_ROUND_LOCK))).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(sa.select(sa.func.pg_advisory_unlock(_DEGRADED_ROUND_LOCK)))
                conn.commit()


def reseed_fences(engine: Engine, gap: int = DEFAULT_RESEED_GAP) -> int:
    """Entering degraded dispatch: jump the sequence past every fence the store may have issued unrecorded
    (the same gap a lost store counter is re-created with), so a degraded fence is never one issued before."""
    with engine.begin() as conn:
        floor = fence_floor(conn)
        if conn.dialect.name != "postgresql":
            return floor + gap
        return int(conn.execute(sa.select(sa.func.setval(FENCE_SEQUENCE, floor + gap, True))).scalar_one())


def next_fence(engine: Engine) -> int:
    """A fence for a lease granted while the store is down; the store's counter is raised above it on recovery
    (its rebuild seeds the counter from `fence_floor`, which reads this sequence)."""
    with engine.begin() as conn:
        if conn.dialect.name != "postgresql":
            return fence_floor(conn) + 1
        return int(conn.execute(sa.select(sa.func.nextval(FENCE_SEQUENCE))).scalar_one())


def urgent_fetches(engine: Engine, horizon: datetime) -> int:
    """Tasks still fetching whose current attempt's output URL expires before `horizon` (or already has)."""
    t, a = generation_tasks.c, task_attempts.c
    current = task_attempts.join(generation_tasks, sa.and_(t.id == a.task_id, t.current_attempt_no == a.attempt_no))
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(current)
                .where(t.status == TaskStatus.OUTPUT_FETCHING.value, a.output_url_expires_at <= horizon)
            ).scalar_one()
        )
