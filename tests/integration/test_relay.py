"""The outbox relay on real PostgreSQL (and the embedded SQLite wake-up): claims, SKIP LOCKED, failures, wake-up."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
import sqlalchemy as sa
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate, outbox
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services.consume import Envelope
from aivedio_engine.testing import failpoints
from aivedio_engine.worker.relay import Relay
from tests.chaos.support import T0, MutableClock, insert_queued_events, insert_tasks, insert_tenant

QUEUE = "dispatch"


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_url}}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


class EnqueueLog(dramatiq.Middleware):
    """Records what a broker accepted, and when; optionally rejects chosen message ids."""

    def __init__(self, reject: set[str] | None = None) -> None:
        self.ids: list[str] = []
        self.times: list[float] = []
        self.reject = reject or set()
        self.enqueued = threading.Event()

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int) -> None:
        if message.message_id in self.reject:
            raise Rejected(f"poisoned message {message.message_id}\nsecond line never stored")

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int) -> None:
        self.ids.append(message.message_id)
        self.times.append(time.monotonic())
        self.enqueued.set()


class Rejected(dramatiq.middleware.MiddlewareError):
    pass


def stub_broker(log: EnqueueLog | None = None) -> StubBroker:
    broker = StubBroker(middleware=[])
    broker.declare_queue(QUEUE)
    if log is not None:
        broker.add_middleware(log)
    return broker


def seed(engine: sa.Engine, n: int, **kw: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        tenant = insert_tenant(conn)
        return insert_queued_events(conn, tenant, insert_tasks(conn, tenant, n), **kw)


def rows(engine: sa.Engine) -> dict[uuid.UUID, sa.Row[Any]]:
    with engine.connect() as conn:
        return {r.id: r for r in conn.execute(sa.select(outbox_events))}


def test_claims_only_due_pending_rows_and_builds_the_envelope(engine: sa.Engine) -> None:
    clock = MutableClock()
    due = seed(engine, 2)
    later = seed(engine, 1, now=T0 + timedelta(seconds=30))
    published_before, dead = seed(engine, 2)
    with engine.begin() as conn:
        o = outbox_events.c
        conn.execute(sa.update(outbox_events).where(o.id == published_before).values(status="PUBLISHED"))
        conn.execute(sa.update(outbox_events).where(o.id == dead).values(status="DEAD"))
    log = EnqueueLog()
    broker = stub_broker(log)
    relay = Relay(engine, broker, clock)

    assert relay.run_once() == 2
    assert log.ids == [str(i) for i in sorted(due)]  # ordered by id
    state = rows(engine)
    assert {i for i, r in state.items() if r.status == OutboxStatus.PENDING} == set(later)
    assert all(state[i].published_at == clock.now() for i in due)

    message = dramatiq.Message.decode(broker.queues[QUEUE].get_nowait())
    row = state[due[0]]
    assert (message.message_id, message.actor_name, message.queue_name) == (str(row.id), row.target, QUEUE)
    envelope = Envelope.parse(message.args[0])
    assert envelope == Envelope(
        event_id=row.id,
        event_type=EventType.GENERATION_QUEUED.value,
        schema_version=1,
        aggregate_id=row.aggregate_id,
        aggregate_version=3,
        tenant_id=row.tenant_id,
        trace_id=row.trace_id,
        causation_id=None,
        occurred_at=T0,
        payload=row.payload,
    )

    assert relay.run_once() == 0  # the future row is not due yet
    clock.advance(30)
    assert relay.run_once() == 1
    assert log.ids[-1] == str(later[0])


def test_two_relays_never_claim_the_same_row(engine: sa.Engine) -> None:
    # Given relay A holding the locks of its claimed batch (paused right after its claim)
    ids = sorted(seed(engine, 100))
    clock = MutableClock()
    log_a, log_b = EnqueueLog(), EnqueueLog()
    relay_a = Relay(engine, stub_broker(log_a), clock, batch_size=40)
    relay_b = Relay(engine, stub_broker(log_b), clock, batch_size=40)
    a_claimed, b_done = threading.Event(), threading.Event()

    def pause_relay_a() -> None:
        if threading.current_thread().name == "relay-a" and not a_claimed.is_set():
            a_claimed.set()
            assert b_done.wait(10), "relay B never finished while A held its locks"

    failpoints.enable("relay.after_claim", pause_relay_a)
    result: dict[str, int] = {}
    thread_a = threading.Thread(target=lambda: result.update(a=relay_a.run_once()), name="relay-a")
    thread_a.start()
    assert a_claimed.wait(10)

    # When relay B runs meanwhile, it skips A's rows instead of waiting for them or taking them
    started = time.monotonic()
    assert relay_b.run_once() == 40
    assert time.monotonic() - started < 2
    b_done.set()
    thread_a.join(10)

    # Then each relay published a disjoint, id-ordered slice, and draining both publishes every row once
    assert result["a"] == 40
    assert log_a.ids == [str(i) for i in ids[:40]]
    assert log_b.ids == [str(i) for i in ids[40:80]]
    while relay_a.run_once() + relay_b.run_once():
        pass
    assert sorted(log_a.ids + log_b.ids) == sorted(str(i) for i in ids)
    assert {r.status for r in rows(engine).values()} == {OutboxStatus.PUBLISHED}


def test_concurrent_relays_publish_every_row_exactly_once(engine: sa.Engine) -> None:
    ids = seed(engine, 2000)
    logs = [EnqueueLog() for _ in range(3)]
    relays = [Relay(engine, stub_broker(log), MutableClock(), batch_size=50) for log in logs]
    go = threading.Barrier(len(relays))

    def drain(relay: Relay) -> None:
        go.wait(5)
        while relay.run_once():
            pass

    threads = [threading.Thread(target=drain, args=(r,)) for r in relays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    published = [i for log in logs for i in log.ids]
    assert len(published) == len(set(published)) == len(ids)
    assert {r.status for r in rows(engine).values()} == {OutboxStatus.PUBLISHED}


def test_enqueue_failure_counts_attempts_backs_off_and_goes_dead(engine: sa.Engine) -> None:
    ok_1, poisoned, ok_2 = sorted(seed(engine, 3))
    clock = MutableClock()
    log = EnqueueLog(reject={str(poisoned)})
    relay = Relay(engine, stub_broker(log), clock, max_publish_attempts=3, retry_backoff_s=1.0)

    assert relay.run_once() == 2  # one bad row does not hold back the others
    assert log.ids == [str(ok_1), str(ok_2)]
    for attempt, backoff in ((1, 1), (2, 2)):
        row = rows(engine)[poisoned]
        assert (row.status, row.publish_attempts) == (OutboxStatus.PENDING, attempt)
        assert row.available_at == clock.now() + timedelta(seconds=backoff)
        assert relay.run_once() == 0  # not due before its backoff
        clock.advance(backoff)
        relay.run_once()
    row = rows(engine)[poisoned]
    assert (row.status, row.publish_attempts) == (OutboxStatus.DEAD, 3)
    assert row.last_error == f"Rejected: poisoned message {poisoned}"
    clock.advance(3600)
    assert relay.run_once() == 0  # DEAD rows are left for `aivedio replay outbox`
    assert relay.failed_total == 3


def test_broker_down_spends_one_attempt_and_keeps_secrets_out_of_last_error(engine: sa.Engine) -> None:
    ids = sorted(seed(engine, 3))
    broker = RedisBroker(url="redis://:s3cret@127.0.0.1:1/0", middleware=[])  # nothing listens on port 1
    broker.declare_queue(QUEUE)
    relay = Relay(engine, broker, MutableClock())

    assert relay.run_once() == 0
    state = rows(engine)
    first = state[ids[0]]
    assert first.publish_attempts == 1 and first.status == OutboxStatus.PENDING
    assert first.last_error.startswith("ConnectionError: ") and "\n" not in first.last_error
    assert "s3cret" not in first.last_error
    # the rest of the batch was not tried against a broker known to be down, so it spent no attempt
    assert [state[i].publish_attempts for i in ids[1:]] == [0, 0]


def _latencies(relay: Relay, log: EnqueueLog, commit_one: Any, n: int = 5) -> list[float]:
    stop = threading.Event()
    thread = threading.Thread(target=relay.run_forever, args=(stop,), name="relay")
    thread.start()
    try:
        assert relay.ready.wait(10), "relay never became ready"
        latencies = []
        for _ in range(n):
            log.enqueued.clear()
            commit_one()
            committed = time.monotonic()
            assert log.enqueued.wait(5), "the relay did not publish within 5 s"
            latencies.append(log.times[-1] - committed)
        return latencies
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive(), "relay did not stop within 5 s of the stop event"


def _commit_one(engine: sa.Engine, tenant: uuid.UUID, task: uuid.UUID) -> Any:
    def commit() -> None:
        with engine.begin() as conn:
            outbox.add(
                conn,
                EventType.GENERATION_QUEUED,
                aggregate_type="generation_task",
                aggregate_id=task,
                aggregate_version=3,
                payload={"task_id": str(task)},
                now=T0,
                tenant_id=tenant,
            )

    return commit


def test_listen_notify_wakes_the_relay_without_polling(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        tenant = insert_tenant(conn)
        (task,) = insert_tasks(conn, tenant, 1)
    log = EnqueueLog()
    # a 10 s fallback: anything published within 0.5 s was woken by NOTIFY
    relay = Relay(engine, stub_broker(log), MutableClock(T0 + timedelta(hours=1)), fallback_interval_s=10)
    latencies = _latencies(relay, log, _commit_one(engine, tenant, task))
    print(
        f"\nNOTIFY wake-up latency: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )
    assert max(latencies) < 0.5


def test_embedded_commit_wakes_the_relay_without_polling(tmp_path: Any) -> None:
    from aivedio_engine.bootstrap import build_context

    ctx = build_context(
        load_settings(overrides={"data_dir": str(tmp_path)}), clock=MutableClock(T0 + timedelta(hours=1))
    )
    migrate.upgrade(ctx.engine)
    with ctx.engine.begin() as conn:
        tenant = insert_tenant(conn)
        (task,) = insert_tasks(conn, tenant, 1)
    log = EnqueueLog()
    relay = Relay(ctx.engine, stub_broker(log), ctx.clock, wakeup=ctx.outbox_wakeup, fallback_interval_s=10)
    latencies = _latencies(relay, log, _commit_one(ctx.engine, tenant, task))
    print(
        f"\nembedded wake-up latency: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )
    assert max(latencies) < 0.5
    ctx.close()


def test_a_row_targeted_at_the_urgent_fetch_route_goes_to_its_queue(engine: sa.Engine) -> None:
    from aivedio_engine.domain.events import URGENT_FETCH

    clock = MutableClock()
    with engine.begin() as conn:
        tenant = insert_tenant(conn)
        urgent = outbox.add(
            conn,
            EventType.FETCH_REQUESTED,
            aggregate_type="task",
            aggregate_id=uuid.uuid4(),
            aggregate_version=1,
            payload={},
            now=T0,
            tenant_id=tenant,
            route=URGENT_FETCH,
        )
        normal = outbox.add(
            conn,
            EventType.FETCH_REQUESTED,
            aggregate_type="task",
            aggregate_id=uuid.uuid4(),
            aggregate_version=1,
            payload={},
            now=T0,
            tenant_id=tenant,
        )
    broker = StubBroker(middleware=[])
    for queue in ("fetch", "fetch_urgent"):
        broker.declare_queue(queue)
    assert Relay(engine, broker, clock).run_once() == 2
    first = dramatiq.Message.decode(broker.queues["fetch_urgent"].get_nowait())
    second = dramatiq.Message.decode(broker.queues["fetch"].get_nowait())
    assert (first.message_id, first.actor_name) == (str(urgent), "fetch_output_urgent")
    assert (second.message_id, second.actor_name) == (str(normal), "fetch_output")
