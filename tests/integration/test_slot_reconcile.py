"""The slot reconciler against a real database: PostgreSQL (with its fence sequence) and embedded SQLite.

The store is the memory store (clock injected) or a private redis-server that the test FLUSHALLs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.clock import new_id
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import generation_tasks, task_attempts, tenants
from aivedio_engine.domain.admission import Limits, scope_names
from aivedio_engine.domain.status import AttemptStatus, TaskStatus
from aivedio_engine.slots.base import Lease
from aivedio_engine.slots.memory import MemorySlotStore
from aivedio_engine.slots.reconcile import fence_floor, in_flight_by_scope, reconcile_slots
from aivedio_engine.slots.redis import RedisSlotStore
from tests.contract import FakeClock, private_redis

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
TTL = 60.0
LIMITS = Limits(platform=64, tenant_default=2, providers={"sim": 3})


@pytest.fixture(params=["postgres", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'aivedio.db'}"
    eng = make_engine(load_settings(overrides={"database": {"url": url}, "data_dir": str(tmp_path)}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def pg_engine(pg_url: str, tmp_path: Path) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_url}, "data_dir": str(tmp_path)}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def add_tenant(engine: sa.Engine) -> str:
    tid = new_id()
    with engine.begin() as conn:
        conn.execute(tenants.insert().values(id=tid, name=f"t-{tid}", created_at=T0, updated_at=T0))
    return str(tid)


def dispatch(
    engine: sa.Engine, store: object, tenant: str, *, model: str = "m1", state: AttemptStatus = AttemptStatus.NEW
) -> tuple[uuid.UUID, Lease | None]:
    """What the dispatcher does: attempt id first, acquire, then record the attempt with the lease's fence."""
    task_id, attempt_id = new_id(), new_id()
    lease = store.acquire(LIMITS.chain(tenant, "sim", model), str(attempt_id), TTL)  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(
            generation_tasks.insert().values(
                id=task_id,
                tenant_id=uuid.UUID(tenant),
                client_idempotency_key=str(task_id),
                request_hash=b"h",
                status=TaskStatus.DISPATCHING.value,
                requested_model=model,
                estimated_cost=Decimal("1"),
                prompt="a lighthouse",
                params={},
                created_at=T0,
                updated_at=T0,
            )
        )
        if lease is not None:
            conn.execute(
                task_attempts.insert().values(
                    id=attempt_id,
                    task_id=task_id,
                    attempt_no=1,
                    provider="sim",
                    model=model,
                    provider_request_key=str(attempt_id),
                    submit_state=state.value,
                    request_fingerprint=b"f",
                    fencing_token=lease.fence,
                    created_at=T0,
                    updated_at=T0,
                )
            )
    return attempt_id, lease


def set_state(engine: sa.Engine, attempt_id: uuid.UUID, state: AttemptStatus) -> None:
    with engine.begin() as conn:
        conn.execute(task_attempts.update().where(task_attempts.c.id == attempt_id).values(submit_state=state.value))


def attempt_fence(engine: sa.Engine, attempt_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(task_attempts.c.fencing_token).where(task_attempts.c.id == attempt_id)
        ).scalar_one()


def guarded_send(engine: sa.Engine, attempt_id: uuid.UUID, fence: int) -> int:
    """The dispatcher's fenced write before calling the provider; returns rows changed."""
    with engine.begin() as conn:
        return conn.execute(
            task_attempts.update()
            .where(task_attempts.c.id == attempt_id, task_attempts.c.fencing_token <= fence)
            .values(submit_state=AttemptStatus.SENDING.value)
        ).rowcount


def test_in_flight_attempts_map_to_their_four_scopes(engine: sa.Engine) -> None:
    store = MemorySlotStore(FakeClock())
    a, b = add_tenant(engine), add_tenant(engine)
    ids = {state: dispatch(engine, store, a, state=state)[0] for state in (AttemptStatus.NEW, AttemptStatus.RUNNING)}
    unknown, _ = dispatch(engine, store, b, model="m2", state=AttemptStatus.UNKNOWN)
    done, _ = dispatch(engine, store, b, state=AttemptStatus.NEW)
    set_state(engine, done, AttemptStatus.SUCCEEDED)
    with engine.connect() as conn:
        active = in_flight_by_scope(conn)
    in_a = sorted(str(i) for i in ids.values())
    assert sorted(active["platform"]) == sorted([*in_a, str(unknown)])  # the SUCCEEDED one holds nothing
    assert sorted(active[f"tenant:{a}"]) == in_a and active[f"tenant:{b}"] == [str(unknown)]
    assert sorted(active["provider:sim"]) == sorted(active["platform"])
    assert sorted(active["model:sim/m1"]) == in_a and active["model:sim/m2"] == [str(unknown)]


def test_fence_floor_is_the_largest_fence_the_database_knows(engine: sa.Engine) -> None:
    store = MemorySlotStore(FakeClock())
    with engine.connect() as conn:
        assert fence_floor(conn) == 0
    _, lease = dispatch(engine, store, add_tenant(engine))
    assert lease is not None
    with engine.connect() as conn:
        assert fence_floor(conn) == lease.fence


def test_reconcile_keeps_live_leases_then_drops_ended_ones(engine: sa.Engine) -> None:
    store = MemorySlotStore(FakeClock())
    tenant = add_tenant(engine)
    attempt, lease = dispatch(engine, store, tenant, state=AttemptStatus.RUNNING)
    assert lease is not None
    report = reconcile_slots(engine, store, ttl_s=TTL)
    assert (report.in_flight, report.kept, report.added, report.fenced) == (1, 1, (), 0)
    assert attempt_fence(engine, attempt) == lease.fence  # the live holder keeps its fence
    assert store.is_current(lease)
    set_state(engine, attempt, AttemptStatus.SUCCEEDED)  # and whoever finished it forgot to release
    report = reconcile_slots(engine, store, ttl_s=TTL)
    assert report.dropped == 1 and store.counts() == {}


def test_a_dispatcher_paused_past_its_ttl_is_fenced_out(engine: sa.Engine) -> None:
    clock = FakeClock()
    store = MemorySlotStore(clock)
    tenant = add_tenant(engine)
    attempt, lease = dispatch(engine, store, tenant)
    assert lease is not None
    clock.advance(TTL + 1)  # the dispatcher stalls; the sweeper was down as long
    assert not store.is_current(lease)
    report = reconcile_slots(engine, store, ttl_s=TTL)
    (new,) = report.added
    assert new.holder == str(attempt) and new.fence > lease.fence and report.fenced == 1
    assert attempt_fence(engine, attempt) == new.fence
    # the paused dispatcher wakes up: the store refuses it and so does the guarded write
    assert store.renew(lease, TTL) is False and store.release(lease) is False
    assert guarded_send(engine, attempt, lease.fence) == 0
    assert guarded_send(engine, attempt, new.fence) == 1  # the current fence may proceed
    assert store.counts()[f"tenant:{tenant}"] == 1


def test_redis_flushall_then_reconcile_restores_counts_and_limits_hold(pg_engine: sa.Engine) -> None:
    engine = pg_engine

    def floor() -> int:
        with engine.connect() as conn:
            return fence_floor(conn)

    with private_redis() as client:
        store = RedisSlotStore(client, key_prefix="aivedio:", fence_floor=floor)
        full, other = add_tenant(engine), add_tenant(engine)
        held = [dispatch(engine, store, full, state=AttemptStatus.RUNNING) for _ in range(2)]
        assert all(lease for _, lease in held)
        assert store.acquire(LIMITS.chain(full, "sim", "m1"), "over", TTL) is None  # tenant limit 2
        before = store.counts()
        db_max = max(lease.fence for _, lease in held if lease)
        assert reconcile_slots(engine, store, ttl_s=TTL).high_water == db_max

        client.flushall()
        assert store.counts() == {} and store.current_fence() == 0
        # Redis is back but empty: admission works again, with fences above everything the database saw
        _, probe = dispatch(engine, store, other)
        assert probe is not None and probe.fence > db_max
        # ...but until the reconciler runs, the full tenant looks empty: that window is what it closes
        report = reconcile_slots(engine, store, ttl_s=TTL)
        assert len(report.added) == 2 and report.fenced == 2
        assert all(lease.fence > probe.fence for lease in report.added)
        counts = store.counts()
        assert counts[f"tenant:{full}"] == before[f"tenant:{full}"] == 2
        assert counts["provider:sim"] == 3 and counts["platform"] == 3
        assert store.acquire(LIMITS.chain(full, "sim", "m1"), "over", TTL) is None  # limit holds right after
        assert store.acquire(LIMITS.chain(other, "sim", "m1"), "over", TTL) is None  # provider sim is full (3)
        # the sequence keeps the high-water mark durably, so the next flush starts above it
        with engine.connect() as conn:
            seq = conn.execute(sa.text("SELECT last_value FROM fencing_token_seq")).scalar_one()
        assert seq == store.current_fence() == report.high_water
        # releases from the attempt rows work with the re-created fences
        for attempt, _ in held:
            set_state(engine, attempt, AttemptStatus.SUCCEEDED)
            with engine.connect() as conn:
                row = conn.execute(
                    sa.select(task_attempts.c.fencing_token).where(task_attempts.c.id == attempt)
                ).scalar_one()
            assert store.release(Lease.of(str(attempt), row, scope_names(full, "sim", "m1")))
        assert f"tenant:{full}" not in store.counts()


def test_the_high_water_mark_never_goes_down(pg_engine: sa.Engine) -> None:
    store = MemorySlotStore(FakeClock(), reseed_gap=0)
    store.seed_fence(500)
    assert reconcile_slots(pg_engine, store, ttl_s=TTL).high_water == 500
    lower = MemorySlotStore(FakeClock(), reseed_gap=0)
    lower.seed_fence(100)
    assert reconcile_slots(pg_engine, lower, ttl_s=TTL).high_water == 500
    with pg_engine.connect() as conn:
        assert fence_floor(conn) == 500
