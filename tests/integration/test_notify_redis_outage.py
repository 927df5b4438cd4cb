"""Client notifications never wait on Redis: tasks that finish while Redis refuses every connection still send
their webhooks, and a notification message the workers give up on raises an alert.

The actors run for real (a Dramatiq worker with its retries and dead-letter middleware, the relay publishing
from the outbox) on PostgreSQL, with the in-process broker, RabbitMQ, and Redis as the broker too (then the
outage holds every message back in the outbox, and nothing may be lost or dead-lettered for it). Redis is a
private server behind a TCP proxy that refuses connections while cut. The engine's clock is under test control:
the outage lasts 60 s of it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts, dead_letters, outbox_events
from aivedio_engine.domain.events import ROUTES, EventType, Queue
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.testing.tcpproxy import TcpProxy
from aivedio_engine.worker.actors import declare_actors
from aivedio_engine.worker.broker import setup_broker
from aivedio_engine.worker.relay import Relay
from tests.contract import private_redis
from tests.support.app import FakeClock, make_context, tenant_with_key
from tests.support.rabbitmq import private_amqp_url
from tests.support.webhook_receiver import Receiver, running_receiver

TASKS = 30
OUTAGE_S = 60
#: the engine's clock moves through the outage in these steps, the workers draining what each step produced
STEP_S = 10
WORKER_THREADS = 4


class Engine:
    """A relay and a worker on one broker, drained on demand."""

    def __init__(self, ctx: AppContext, redis_proxy: TcpProxy) -> None:
        self.ctx = ctx
        #: Redis as the broker: while it is cut, nothing can be published or consumed, only held back
        self.broker_down = lambda: ctx.settings.broker.kind == "redis" and not redis_proxy.is_up
        self.broker = setup_broker(ctx.settings, ctx)
        declare_actors(self.broker, ctx)
        self.worker = dramatiq.Worker(self.broker, worker_threads=WORKER_THREADS, worker_timeout=50)
        self.worker.start()
        self.relay = Relay(ctx.engine, self.broker, ctx.clock)

    def settle(self) -> None:
        """Publish what is due and wait for the workers, until a round publishes nothing more."""
        for _ in range(50):
            published = 0
            while n := self.relay.run_once():
                published += n
            if self.broker_down():
                assert not published
                return
            for queue in (Queue.NOTIFY, Queue.WEBHOOKS):
                self.broker.join(queue.value, timeout=120_000)
            self.worker.join()
            if not published:
                return
        raise AssertionError("the outbox never settled")

    def close(self) -> None:
        self.worker.stop(timeout=10_000)
        self.broker.close()


@pytest.fixture(params=["stub", "rabbitmq", "redis"])
def broker_settings(request: pytest.FixtureRequest, redis_proxy: TcpProxy) -> dict[str, Any]:
    if request.param == "stub":
        return {"kind": "stub"}
    if request.param == "redis":
        return {"kind": "redis", "url": redis_proxy.url("redis", "/1")}
    vhost = private_amqp_url("notify-outage")
    url = next(vhost)
    request.addfinalizer(lambda: next(vhost, None))
    return {"kind": "rabbitmq", "url": url}


@pytest.fixture
def redis_proxy() -> Iterator[TcpProxy]:
    with private_redis() as client, TcpProxy(client.connection_pool.connection_kwargs["path"]) as proxy:
        yield proxy


@pytest.fixture
def ctx(tmp_path: Path, pg_url: str, redis_proxy: TcpProxy, broker_settings: dict[str, Any]) -> Iterator[AppContext]:
    context = make_context(
        tmp_path / "data",
        pg_url,
        clock=FakeClock(),
        mode="distributed",
        redis={"url": redis_proxy.url("redis", "/0"), "key_prefix": "notify-outage:"},
        broker=broker_settings,
        # every worker thread may post to the one endpoint: none is handed back to wait for the engine's clock
        client_webhooks={"allow_private_networks": True, "max_in_flight_per_endpoint": WORKER_THREADS},
    )
    yield context
    context.close()


@pytest.fixture
def engine(ctx: AppContext, redis_proxy: TcpProxy) -> Iterator[Engine]:
    running = Engine(ctx, redis_proxy)
    yield running
    running.close()


def _final_statuses(rx: Receiver) -> dict[str, str]:
    """task id → the terminal status a verified webhook told the receiver."""
    return {r.data["id"]: r.data["status"] for r in rx.verified() if r.data["status"] == "CANCELED"}


def _count(ctx: AppContext, table: sa.Table, *where: Any) -> int:
    with ctx.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def _signal_failures() -> float:
    return REGISTRY.get_sample_value("aivedio_sse_signals_dropped_total") or 0.0


def test_tasks_finishing_during_a_redis_outage_send_every_webhook(
    ctx: AppContext, engine: Engine, redis_proxy: TcpProxy
) -> None:
    who = tenant_with_key(ctx, "acme", credits=100_000)
    with running_receiver() as rx:
        rx.secrets.append(ctx.webhooks.add(who.tenant_id, rx.url).secret)
        ids = [
            str(
                ctx.generations.create(
                    who.tenant_id, f"k{i}", {"prompt": f"scene {i}", "model": "local-v1", "duration_s": 2}
                ).task.id
            )
            for i in range(TASKS)
        ]
        engine.settle()
        assert len(rx.verified()) == TASKS  # the QUEUED webhooks, while Redis is up

        dropped_before = _signal_failures()
        redis_proxy.cut()
        for task_id in ids:
            ctx.generations.cancel(who.tenant_id, uuid.UUID(task_id))
        for _ in range(OUTAGE_S // STEP_S):
            engine.settle()
            ctx.clock.advance(STEP_S)  # type: ignore[attr-defined]
        engine.settle()
        assert redis_proxy.refused > 0, "Redis was asked, and refused"
        redis_proxy.restore()
        # a row whose publish failed against a Redis broker is due again after its back-off (the relay's own)
        ctx.clock.advance(OUTAGE_S)  # type: ignore[attr-defined]
        engine.settle()

        finals = _final_statuses(rx)
        delivered = [d for d in ctx.webhooks.deliveries(limit=1000) if d.state == "DELIVERED"]
    # (tasks told their final status, deliveries delivered, dead letters)
    assert (len(finals), len(delivered), _count(ctx, dead_letters)) == (TASKS, 2 * TASKS, 0)
    assert finals == dict.fromkeys(ids, "CANCELED")
    assert _count(ctx, outbox_events, outbox_events.c.status == OutboxStatus.DEAD.value) == 0
    if ctx.settings.broker.kind != "redis":
        # each signal Redis refused was dropped and counted (the streams catch up from the state events)
        assert _signal_failures() - dropped_before >= TASKS


def test_a_dead_lettered_notification_message_raises_an_alert(ctx: AppContext, engine: Engine) -> None:
    notify = ROUTES[EventType.TASK_STATUS_CHANGED]
    other = ROUTES[EventType.GENERATION_QUEUED]
    # bodies no consumer can parse: dead-lettered without a retry
    for route in (other, notify):
        engine.broker.enqueue(
            dramatiq.Message(
                queue_name=route.queue.value,
                actor_name=route.actor,
                args=({"event_type": "task.status.changed"},),
                kwargs={},
                options={},
                message_id=str(uuid.uuid4()),
            )
        )
    engine.broker.join(Queue.DISPATCH.value, timeout=30_000)
    engine.settle()
    assert _count(ctx, dead_letters) == 2
    with ctx.engine.connect() as conn:
        raised = conn.execute(sa.select(alerts.c.rule, alerts.c.status, alerts.c.subject_id, alerts.c.message)).all()
    assert [(a.rule, a.status, a.subject_id) for a in raised] == [
        ("notification_dead_lettered", "OPEN", notify.actor)
    ], "only the notification's dead letter pages"
    assert "aivedio replay dlq --actor notify_status_changed" in raised[0].message
