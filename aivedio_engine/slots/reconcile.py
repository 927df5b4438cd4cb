"""The slot reconciler: make the slot store agree with the in-flight attempts in the database (seed 000 §4.8.12).

Redis is soft admission and may lose everything; PostgreSQL is the truth. Every sweeper pass:
1. reads every attempt whose submit_state is in flight (NEW, SENDING, ACKED, RUNNING, UNKNOWN — an UNKNOWN one
   may be running at the provider, so it keeps its slot) with its task's tenant, and the fence floor;
2. `store.rebuild()`: leases for those attempts are refreshed (so a running job never loses its slot while the
   sweeper is alive), lost ones are re-created with new fences, and leases of attempts that ended are dropped;
3. for each re-created lease, raises the attempt's `fencing_token` to the new fence — this is what fences out
   a dispatcher that was paused past its TTL: its guarded write (`WHERE fencing_token <= :old_fence`) now
   matches no row;
4. records the store's fence as a durable high-water mark, so a flushed counter can be re-created above it.

Fences come from one counter only, the store's. A second generator (the PostgreSQL sequence issuing fences for
re-created leases while Redis issues them for acquires) would hand out the same numbers twice. The sequence
`fencing_token_seq` is therefore used as the durable high-water mark: advanced here (never lowered — setval
under an advisory lock, only upwards), read back by `fence_floor()`. SQLite has no sequence; there the floor is
the largest fence recorded on an attempt, which suffices for the in-process store (it loses its counter only
with the process, and the reseed gap covers what was issued since).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.tables import generation_tasks, slot_grants, task_attempts
from aivedio_engine.domain.admission import scope_names
from aivedio_engine.domain.status import ATTEMPT_IN_FLIGHT
from aivedio_engine.slots.base import Lease, SlotStore

FENCE_SEQUENCE = "fencing_token_seq"
#: serializes high-water updates across reconcilers ("aivedio" + 1; migrate uses + 0)
_HIGH_WATER_LOCK = 0x61697665_64696F01


@dataclass(frozen=True)
class ReconcileReport:
    in_flight: int
    kept: int
    dropped: int
    added: tuple[Lease, ...]
    #: attempt rows whose fencing_token was raised to a re-created lease's fence
    fenced: int
    fence_floor: int
    high_water: int
    counts: Mapping[str, int] = field(default_factory=dict)


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
    """The largest fence the database knows of: attempts, slot grants and (PostgreSQL) the high-water sequence."""
    floor = conn.execute(
        sa.select(
            sa.func.coalesce(sa.select(sa.func.max(task_attempts.c.fencing_token)).scalar_subquery(), 0),
            sa.func.coalesce(sa.select(sa.func.max(slot_grants.c.fencing_token)).scalar_subquery(), 0),
        )
    ).one()
    best = max(int(floor[0]), int(floor[1]))
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


def reconcile_slots(engine: Engine, store: SlotStore, *, ttl_s: float) -> ReconcileReport:
    """One reconciler pass (the sweeper runs it every few seconds; `ttl_s` must exceed that interval)."""
    with engine.connect() as conn:
        with conn.begin():
            active = in_flight_by_scope(conn)
            floor = fence_floor(conn)
    report = store.rebuild(active, ttl_s=ttl_s, fence_floor=floor)
    with engine.connect() as conn:
        conn = conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            fenced = raise_fences(conn, report.added)
            high_water = record_high_water(conn, store.current_fence())
    holders = {h for hs in active.values() for h in hs}
    return ReconcileReport(
        len(holders), report.kept, report.dropped, report.added, fenced, floor, high_water, report.counts
    )
