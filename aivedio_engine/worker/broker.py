"""The one place a Dramatiq broker is built; call `setup_broker` before declaring actors.

`dramatiq.actor` binds to `get_broker()` when no broker is passed, and `get_broker()` silently creates a
RabbitMQ/Redis broker on localhost. Our actors are declared by `actors.declare_actors(broker, ctx)` with an
explicit broker, so no import ever triggers that fallback; `setup_broker` still installs the broker globally for
any library code that asks for it.

Dramatiq's stock retry defaults (20 retries, backoff up to 7 days) are wrong for this product, so the broker is
built with conservative defaults; every actor still declares its own options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, ShutdownNotifications, TimeLimit

from aivedio_engine.config import ConfigError, Settings
from aivedio_engine.worker.dead_letters import DeadLetters
from aivedio_engine.worker.undelivered import Undelivered

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext

#: Redis: a worker silent for this long is presumed dead and its unacked messages are requeued. Dramatiq's 60 s
#: default plus its 0.1 % maintenance chance makes redelivery after a crash take minutes (reliability).
REDIS_HEARTBEAT_TIMEOUT_MS = 30_000
#: Redis: per-million chance that a broker call also runs queue maintenance (requeue from dead workers).
REDIS_MAINTENANCE_CHANCE = 10_000
#: RabbitMQ: seconds between heartbeats on every connection (server and client both check them).
RABBITMQ_HEARTBEAT_S = 15
#: fallbacks for an actor that declares nothing; real actors set their own.
DEFAULT_MAX_RETRIES = 3
DEFAULT_MIN_BACKOFF_MS = 1_000
DEFAULT_MAX_BACKOFF_MS = 60_000
DEFAULT_TIME_LIMIT_MS = 60_000


def redis_namespace(settings: Settings) -> str:
    """Broker keys live under the product's Redis key prefix, so a test (or a second deployment) can isolate."""
    prefix = settings.redis.key_prefix.rstrip(":")
    return f"{prefix}:dramatiq" if prefix else "dramatiq"


def rabbitmq_url(settings: Settings) -> str:
    """The AMQP URL with a heartbeat: pika's blocking connections answer heartbeats only while they do I/O, so an idle
    relay connection is closed by the server after two missed ones and reopened by Dramatiq on the next enqueue;
    a short interval finds a dead broker in seconds instead of minutes."""
    url = settings.broker.url
    if "heartbeat=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}heartbeat={RABBITMQ_HEARTBEAT_S}"


def _middleware() -> list[dramatiq.Middleware]:
    return [
        AgeLimit(),
        TimeLimit(time_limit=DEFAULT_TIME_LIMIT_MS),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(
            max_retries=DEFAULT_MAX_RETRIES, min_backoff=DEFAULT_MIN_BACKOFF_MS, max_backoff=DEFAULT_MAX_BACKOFF_MS
        ),
    ]


def setup_broker(settings: Settings, ctx: AppContext | None = None) -> dramatiq.Broker:
    """Build the broker for `settings.broker.kind`, add the dead-letter middleware and make it the global broker.

    Args:
        settings: effective settings (`broker.kind`, `broker.url`, `redis.key_prefix`). A RabbitMQ deployment (or
            test) is isolated by the virtual host in `broker.url`, a Redis one by `redis.key_prefix`.
        ctx: supplies the engine and clock the dead-letter middleware writes with; built from `settings` when
            omitted. The engine is only touched when a message is dead-lettered.
    """
    if ctx is None:
        from aivedio_engine.bootstrap import build_context

        ctx = build_context(settings)
    kind = settings.broker.kind
    broker: dramatiq.Broker
    if kind == "stub":
        # fail_fast_default=False: a dead-lettered message is an outcome we record, not an error for join()
        broker = StubBroker(middleware=_middleware(), fail_fast_default=False)
    elif kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        # Push delivery: an idle consumer blocks on its socket, so a message reaches its actor in about a millisecond
        # with no polling traffic. Publisher confirms: the relay marks a row PUBLISHED only once RabbitMQ holds the
        # (persistent) message, which keeps the outbox's at-least-once promise across a broker restart.
        broker = RabbitmqBroker(url=rabbitmq_url(settings), middleware=_middleware(), confirm_delivery=True)
    elif kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(
            url=settings.broker.url,
            namespace=redis_namespace(settings),
            middleware=_middleware(),
            heartbeat_timeout=REDIS_HEARTBEAT_TIMEOUT_MS,
            maintenance_chance=REDIS_MAINTENANCE_CHANCE,
        )
    else:
        raise ConfigError(f"invalid setting broker.kind: {kind!r} (use stub, rabbitmq or redis)")
    context = ctx
    broker.add_middleware(DeadLetters(lambda: context.engine, context.clock.now))
    if kind == "stub":  # its queues die with the process: `Runtime.shutdown` hands what was left to the outbox
        broker.add_middleware(Undelivered())
    dramatiq.set_broker(broker)
    return broker
