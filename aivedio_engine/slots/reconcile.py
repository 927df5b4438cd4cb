"""The slot reconciler: make the slot store agree with the in-flight attempts in the database.

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

from collections.abc import Mapping
from dataclasses import dataclass, field

from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION
from aivedio_engine.db.fences import fence_floor, in_flight_by_scope, raise_fences, record_high_water
from aivedio_engine.db.handles import Engine
from aivedio_engine.slots.base import Lease, SlotStore


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
