"""Consumers: inbox dedup, the generation.queued effect, and dead letters — one suite on PostgreSQL and SQLite.

The actors run for real: a StubBroker, a Dramatiq Worker, the actors declared by `declare_actors`, the relay
publishing from the outbox. Effects are counted by a database trigger, not by the code under test.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import BrokerSettings, load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.tables import dead_letters, generation_tasks, inbox_dedup, outbox_events
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.services import intake
from aivedio_engine.services.consume import DUPLICATE, PROCESSED, consume_once
from aivedio_engine.testing import failpoints
from aivedio_engine.worker.actors import declare_actors
from aivedio_engine.worker.broker import setup_broker
from aivedio_engine.worker.relay import Relay
from tests.chaos.support import (
    MutableClock,
    count,
    effects_per_task,
    insert_queued_events,
    insert_tasks,
    insert_tenant,
    install_effect_counter,
    wait_until,
)
from tests.support.rabbitmq import private_amqp_url

GROUP = intake.CONSUMER_GROUP


@pytest.fixture(params=["postgresql", "sqlite"])
def ctx(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[AppContext]:
    if request.param == "postgresql":
        overrides: dict[str, Any] = {"database": {"url": request.getfixturevalue("pg_url")}}
    else:
        overrides = {"data_dir": str(tmp_path)}
    context = build_context(load_settings(overrides=overrides), clock=MutableClock())
    migrate.upgrade(context.engine)
    with context.engine.begin() as conn:
        install_effect_counter(conn)
    yield context
    context.close()


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


@pytest.fixture(params=["stub", "rabbitmq"])
def broker(request: pytest.FixtureRequest, ctx: AppContext) -> Iterator[dramatiq.Broker]:
    """The in-process broker, and RabbitMQ (the distributed one: real redeliveries, delay queues, a private vhost)."""
    settings = ctx.settings
    if request.param == "rabbitmq":
        vhost = private_amqp_url("consumers")
        url = next(vhost)
        request.addfinalizer(lambda: next(vhost, None))  # deletes the vhost once the broker is closed
        settings = settings.model_copy(update={"broker": BrokerSettings(kind="rabbitmq", url=url)})
    broker = setup_broker(settings, ctx)
    declare_actors(broker, ctx)
    yield broker
    broker.close()


@pytest.fixture
def worker(broker: dramatiq.Broker) -> Iterator[dramatiq.Worker]:
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
    worker.start()
    yield worker
    worker.stop(timeout=10_000)


def drain(broker: dramatiq.Broker, worker: dramatiq.Worker, *queues: str) -> None:
    for q in queues or ("dispatch",):
        broker.join(q, timeout=10_000)
    worker.join()


def seed(
    ctx: AppContext,
    n: int = 1,
    *,
    task_version: int = 3,
    event_version: int = 3,
    status: TaskStatus = TaskStatus.QUEUED,
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    with ctx.engine.begin() as conn:
        tenant = insert_tenant(conn)
        tasks = insert_tasks(conn, tenant, n, version=task_version, status=status)
        events = insert_queued_events(conn, tenant, tasks, version=event_version)
    return tasks, events


def task_row(ctx: AppContext, task_id: uuid.UUID) -> sa.Row[Any]:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()


def inbox_rows(ctx: AppContext) -> list[sa.Row[Any]]:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(inbox_dedup)).all()


def test_same_envelope_delivered_twice_has_one_effect(
    ctx: AppContext, broker: dramatiq.Broker, worker: dramatiq.Worker
) -> None:
    (task,), (event,) = seed(ctx)
    duplicates: list[int] = []
    failpoints.enable("consume.duplicate", lambda: duplicates.append(1))
    relay = Relay(ctx.engine, broker, ctx.clock)
    assert relay.run_once() == 1
    drain(broker, worker)
    # a relay that crashed after enqueueing but before marking publishes the row again
    with ctx.engine.begin() as conn:
        conn.execute(sa.update(outbox_events).values(status="PENDING"))
    assert relay.run_once() == 1
    drain(broker, worker)

    assert len(duplicates) == 1
    (inbox,) = inbox_rows(ctx)
    assert (inbox.consumer_group, inbox.event_id, inbox.aggregate_id, inbox.result_digest) == (
        GROUP,
        event,
        task,
        "ready",
    )
    assert effects_per_task(ctx.engine) == {task.hex: 1}
    row = task_row(ctx, task)
    assert row.next_action_at is not None and (row.status, row.version) == (TaskStatus.QUEUED, 3)


@pytest.mark.parametrize(
    ("task_version", "status", "digest"),
    [
        (4, TaskStatus.QUEUED, "skipped: status=QUEUED version=4"),
        (3, TaskStatus.CANCELED, "skipped: status=CANCELED version=3"),
    ],
)
def test_stale_event_is_consumed_without_effect(
    ctx: AppContext,
    broker: dramatiq.Broker,
    worker: dramatiq.Worker,
    task_version: int,
    status: TaskStatus,
    digest: str,
) -> None:
    (task,), _ = seed(ctx, task_version=task_version, status=status)
    assert Relay(ctx.engine, broker, ctx.clock).run_once() == 1
    drain(broker, worker)
    assert [r.result_digest for r in inbox_rows(ctx)] == [digest]
    assert task_row(ctx, task).next_action_at is None
    assert effects_per_task(ctx.engine) == {}


def test_exception_in_fn_leaves_no_inbox_row_and_no_effect(ctx: AppContext) -> None:
    (task,), (event,) = seed(ctx)
    now = ctx.clock.now()

    def failing(conn: sa.Connection) -> str:
        conn.execute(sa.update(generation_tasks).values(next_action_at=now))
        raise RuntimeError("decided to fail after writing")

    with pytest.raises(RuntimeError):
        consume_once(ctx.engine, GROUP, event, task, failing, now)
    assert inbox_rows(ctx) == [] and effects_per_task(ctx.engine) == {}
    # the redelivery is not mistaken for a duplicate
    assert consume_once(ctx.engine, GROUP, event, task, lambda conn: "second try", now) == PROCESSED
    assert consume_once(ctx.engine, GROUP, event, task, lambda conn: "third", now) == DUPLICATE
    assert [r.result_digest for r in inbox_rows(ctx)] == ["second try"]


def test_always_failing_actor_lands_in_dead_letters_once(
    ctx: AppContext, broker: dramatiq.Broker, worker: dramatiq.Worker
) -> None:
    calls: list[int] = []

    def always_fails(n: int) -> None:
        calls.append(n)
        raise RuntimeError(f"boom {n}\nsecond line")

    actors = {
        retries: dramatiq.actor(
            always_fails,
            broker=broker,
            actor_name=f"always_fails_{retries}",
            queue_name="maintenance",
            max_retries=retries,
            min_backoff=10,
            max_backoff=10,
            time_limit=5_000,
        )
        for retries in (0, 1)
    }
    # a worker started before the queue existed picks it up when it is declared
    actors[0].send(0)
    actors[1].send(1)
    wait_until(lambda: count(ctx.engine, dead_letters) == 2, 10, "two dead letters")
    drain(broker, worker, "maintenance")
    assert sorted(calls) == [0, 1, 1]  # max_retries=1: one retry, then dead

    with ctx.engine.connect() as conn:
        letters = {r.actor: r for r in conn.execute(sa.select(dead_letters))}
    first = letters["always_fails_0"]
    assert (first.queue, first.seen_count, first.replayed_at) == ("maintenance", 1, None)
    assert first.error == "RuntimeError: boom 0"
    assert "always_fails" in first.traceback_tail and "traceback" not in first.message["options"]
    assert first.message["args"] == [0]
    assert letters["always_fails_1"].message["options"]["retries"] == 2

    # the same message dead again (e.g. after a replay) bumps the row instead of adding one
    broker.enqueue(
        dramatiq.Message(
            queue_name="maintenance",
            actor_name="always_fails_0",
            args=(0,),
            kwargs={},
            options={},
            message_id=first.message_id,
        )
    )
    wait_until(lambda: _seen_count(ctx, first.message_id) == 2, 10, "seen_count 2")
    assert count(ctx.engine, dead_letters) == 2


def _seen_count(ctx: AppContext, message_id: str) -> int:
    with ctx.engine.connect() as conn:
        return conn.execute(
            sa.select(dead_letters.c.seen_count).where(dead_letters.c.message_id == message_id)
        ).scalar()


def test_invalid_envelope_is_dead_lettered_without_retries(
    ctx: AppContext, broker: dramatiq.Broker, worker: dramatiq.Worker
) -> None:
    message = dramatiq.Message(
        queue_name="dispatch",
        actor_name="on_generation_queued",
        args=({"event_id": "not-a-uuid"},),
        kwargs={},
        options={},
    )
    broker.enqueue(message)
    drain(broker, worker)
    with ctx.engine.connect() as conn:
        (letter,) = conn.execute(sa.select(dead_letters)).all()
    assert letter.message_id == message.message_id
    assert letter.error.startswith("InvalidEnvelope: ")
    assert "retries" not in letter.message["options"]  # `throws`: rejected on the first failure, never retried
    assert inbox_rows(ctx) == []


def test_concurrent_duplicates_apply_once_on_postgres(pg_url: str) -> None:
    """Two deliveries of one event at the same time: the second waits on the first's dedup row, then no-ops."""
    context = build_context(load_settings(overrides={"database": {"url": pg_url}}), clock=MutableClock())
    migrate.upgrade(context.engine)
    with context.engine.begin() as conn:
        install_effect_counter(conn)
    (task,), (event,) = seed(context)
    inside, release = threading.Event(), threading.Event()
    results: dict[str, str] = {}

    def slow_effect(conn: sa.Connection) -> str:
        conn.execute(sa.update(generation_tasks).values(next_action_at=context.clock.now()))
        inside.set()
        assert release.wait(10)
        return "first"

    def deliver(name: str, fn: Any) -> None:
        results[name] = consume_once(context.engine, GROUP, event, task, fn, context.clock.now())

    first = threading.Thread(target=deliver, args=("first", slow_effect))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=deliver, args=("second", lambda conn: pytest.fail("second effect ran")))
    second.start()
    # the second delivery is blocked inside its INSERT on the first one's uncommitted key
    wait_until(lambda: _backends_waiting_on_a_lock(context.engine) >= 1, 10, "the duplicate to block on the lock")
    release.set()
    first.join(10)
    second.join(10)
    assert results == {"first": PROCESSED, "second": DUPLICATE}
    assert effects_per_task(context.engine) == {task.hex: 1}
    context.close()


def _backends_waiting_on_a_lock(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).scalar_one()
