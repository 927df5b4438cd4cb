"""RedisNotifier against a real Redis: cross-process wake-ups, key-prefix isolation, and surviving Redis trouble.

Publishers are separate notifier instances (separate connections), as worker processes would be; waiters are
asyncio tasks, as SSE handlers are. Every wait is bounded, so a broken notifier fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from prometheus_client import REGISTRY

from aivedio_engine.config import load_settings
from aivedio_engine.notify import InProcessNotifier, RedisNotifier, build_notifier
from tests.contract import SHARED_REDIS_URL, private_redis, shared_redis

WAIT_S = 5.0
#: how long a waiter that must NOT be woken is given; a wrong wake-up would arrive well within it
QUIET_S = 0.3


@pytest.fixture
def prefix() -> Iterator[str]:
    shared_redis().close()  # skips (or fails under CI) when the shared Redis is down
    yield f"aivedio-test-{uuid.uuid4().hex[:8]}:"


def notifier(prefix: str) -> RedisNotifier:
    return RedisNotifier.from_url(SHARED_REDIS_URL, key_prefix=prefix)


async def listening(n: RedisNotifier) -> None:
    assert await asyncio.to_thread(n.listening.wait, WAIT_S), "the listener did not subscribe"


def test_publish_from_another_process_wakes_that_tasks_waiters_only(prefix: str) -> None:
    api, worker = notifier(prefix), notifier(prefix)
    task, other = uuid.uuid4(), uuid.uuid4()

    async def scenario() -> None:
        with api.subscribe(task) as first, api.subscribe(task) as second, api.subscribe(other) as bystander:
            await listening(api)
            # published from a plain thread, like a Dramatiq worker thread
            threading.Thread(target=worker.publish, args=(task, 7)).start()
            assert await first.wait(WAIT_S) and await second.wait(WAIT_S), "one signal fans out to every waiter"
            assert not await bystander.wait(QUIET_S)
            assert not await first.wait(QUIET_S), "the latch resets after a wake-up"
            assert api.subscribers(task) == 2
        assert api.subscribers() == 0

    try:
        asyncio.run(scenario())
    finally:
        api.close()
        worker.close()
    assert worker._thread is None, "a publish-only process never opens a subscriber connection"


def test_another_key_prefix_is_another_deployment(prefix: str) -> None:
    api, stranger = notifier(prefix), notifier(prefix + "other:")
    task = uuid.uuid4()

    async def scenario() -> None:
        with api.subscribe(task) as sub:
            await listening(api)
            await asyncio.to_thread(stranger.publish, task, 1)
            assert not await sub.wait(QUIET_S)

    try:
        asyncio.run(scenario())
    finally:
        api.close()
        stranger.close()


def test_after_losing_the_connection_it_resubscribes_and_wakes_every_waiter() -> None:
    # a private server: killing pub/sub clients on the shared one would disturb its other users
    with private_redis() as admin:
        path = admin.connection_pool.connection_kwargs["path"]
        api = RedisNotifier(redis.Redis(unix_socket_path=path), key_prefix="t:", retry_s=0.05)
        worker = RedisNotifier(redis.Redis(unix_socket_path=path), key_prefix="t:")
        task = uuid.uuid4()

        async def scenario() -> None:
            with api.subscribe(task) as sub:
                await listening(api)
                assert admin.client_kill_filter(_type="pubsub") >= 1
                # signals published during the gap are lost, so the reconnect itself wakes everyone to re-read
                assert await sub.wait(WAIT_S), "no wake-up after the reconnect"
                await listening(api)
                await asyncio.to_thread(worker.publish, task, 2)
                assert await sub.wait(WAIT_S), "no wake-up from a publish after the reconnect"

        try:
            asyncio.run(scenario())
        finally:
            api.close()
            worker.close()


def test_an_unreachable_redis_never_breaks_a_waiter_and_publish_drops_the_signal_and_counts_it() -> None:
    down = RedisNotifier.from_url("redis://127.0.0.1:1/0", key_prefix="t:", retry_s=0.05)
    task = uuid.uuid4()

    async def scenario() -> None:
        with down.subscribe(task) as sub:
            assert not await sub.wait(QUIET_S), "waiters just time out (and re-read the history on the heartbeat)"
        assert not down.listening.is_set()

    try:
        asyncio.run(scenario())
        assert down._thread is not None and down._thread.is_alive(), "the listener keeps retrying"
        dropped = REGISTRY.get_sample_value("aivedio_sse_signals_dropped_total") or 0.0
        started = time.monotonic()
        down.publish(task, 1)  # no error for the caller to retry: the streams catch up on their heartbeat
        assert time.monotonic() - started < RedisNotifier.PUBLISH_TIMEOUT_S
        assert REGISTRY.get_sample_value("aivedio_sse_signals_dropped_total") == dropped + 1
    finally:
        down.close()
    assert not down._thread.is_alive()


def test_the_mode_picks_the_notifier() -> None:
    embedded = build_notifier(load_settings(overrides={"mode": "embedded"}))
    assert isinstance(embedded, InProcessNotifier)
    distributed = build_notifier(
        load_settings(
            overrides={
                "mode": "distributed",
                "database": {"url": "postgresql+psycopg://u@127.0.0.1/db"},
                "redis": {"key_prefix": "tenant-a:"},
            }
        )
    )
    try:
        assert isinstance(distributed, RedisNotifier) and distributed.channel == "tenant-a:task-status"
    finally:
        distributed.close()
