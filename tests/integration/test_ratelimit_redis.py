"""The Redis token bucket: its Lua script gives the pure function's answers, under the configured prefix."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from aivedio_engine.config import load_settings
from aivedio_engine.domain.ratelimit import Bucket, Rate, take
from aivedio_engine.ratelimit import build_bucket_store
from aivedio_engine.ratelimit.fallback import FallbackBucketStore
from aivedio_engine.ratelimit.memory import MemoryBucketStore
from aivedio_engine.ratelimit.redis import RedisBucketStore
from tests.support.redis import REDIS_URL, private_prefix


@pytest.fixture
def prefix() -> Iterator[str]:
    yield from private_prefix("ratelimit")


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


def test_the_lua_script_answers_as_the_domain_function(client: redis.Redis, prefix: str) -> None:
    store = RedisBucketStore(client, prefix, server_time=False)
    rng = random.Random(7)
    for case in range(20):
        rate = Rate(rng.uniform(0.2, 20), rng.randint(1, 30))
        bucket: Bucket | None = None
        now = 1_700_000_000.0 + case * 10_000
        for _ in range(60):
            now += rng.choice([0.0, 0.0, rng.uniform(0, 0.5), rng.uniform(0, 5), -rng.uniform(0, 1)])
            expected, bucket = take(bucket, rate, now)
            got = store.take(f"t{case}", rate, now)
            assert got.allowed == expected.allowed, (case, now)
            assert got.remaining == pytest.approx(expected.remaining, abs=1e-9)
            assert got.retry_after_s == pytest.approx(expected.retry_after_s, abs=1e-9)


def test_buckets_live_under_the_prefix_and_expire_once_they_would_be_full(client: redis.Redis, prefix: str) -> None:
    store = RedisBucketStore(client, prefix)  # the server's clock
    rate = Rate(per_s=2, burst=4)
    assert [store.take("tenant:a:generations", rate, 0).allowed for _ in range(5)] == [True] * 4 + [False]
    key = prefix + "ratelimit:tenant:a:generations"
    assert client.exists(key) and 0 < client.pttl(key) <= 2000 + 1000
    assert [k.decode() for k in client.scan_iter(match="*ratelimit:tenant:a:*")] == [key]


def test_distributed_mode_builds_the_redis_bucket_with_the_fallback(prefix: str) -> None:
    settings = load_settings(
        None,
        {
            "mode": "distributed",
            "database": {"url": "postgresql+psycopg://postgres@127.0.0.1:5432/unused"},
            "redis": {"url": REDIS_URL, "key_prefix": prefix},
        },
    )
    store = build_bucket_store(settings)
    assert isinstance(store, FallbackBucketStore)
    assert store.take("t", Rate(1, 1), 0).allowed and not store.take("t", Rate(1, 1), 0).allowed
    assert not store.degraded
    assert isinstance(build_bucket_store(load_settings(None, {})), MemoryBucketStore)


def test_takes_queued_on_the_loop_go_as_one_pipeline_and_answer_as_if_sent_alone(
    client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Takes that queue while a round trip is out are sent together; each keeps its own answer (the domain
    function's, in the order they were taken), also after Redis forgot the script (NOSCRIPT: it is loaded again)."""
    import asyncio

    import redis.asyncio

    sent: list[int] = []
    real_execute = redis.asyncio.client.Pipeline.execute

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(len(self.command_stack))
        return await real_execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", counting)
    store = RedisBucketStore(
        client, prefix, server_time=False, loop_client=lambda: redis.asyncio.Redis.from_url(REDIS_URL)
    )
    rate, now = Rate(per_s=1, burst=5), 1_700_000_000.0
    keys = [f"t{i % 3}" for i in range(24)]  # 8 takes per bucket: 5 allowed, 3 refused each

    async def storm() -> list[Any]:
        first = await asyncio.gather(*(store.take_on_loop(k, rate, now) for k in keys))
        client.script_flush()  # Redis restarted, say: the next batch meets NOSCRIPT
        again = await asyncio.gather(*(store.take_on_loop(f"again-{k}", rate, now) for k in keys))
        return [*first, *again]

    got = asyncio.run(storm())
    buckets: dict[str, Bucket | None] = {}
    expected = []
    for k in [*keys, *(f"again-{k}" for k in keys)]:
        verdict, buckets[k] = take(buckets.get(k), rate, now)
        expected.append(verdict)
    assert [g.allowed for g in got] == [e.allowed for e in expected]
    assert [g.allowed for g in got[:24]].count(True) == 15
    for g, e in zip(got, expected, strict=True):
        assert g.remaining == pytest.approx(e.remaining, abs=1e-9)
        assert g.retry_after_s == pytest.approx(e.retry_after_s, abs=1e-9)
    assert sent and max(sent) > 1 and len(sent) < 2 * len(keys)  # batched, not one round trip per take


def test_takes_of_one_bucket_queued_together_are_one_script_call_taking_each_token_in_turn(
    client: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load most of a batch is one tenant's: its takes are one call of the script (n tokens, one after the
    other), each answered as the domain function answers the n-th take."""
    import asyncio

    import redis.asyncio
    import redis.commands.core

    calls: list[list[Any]] = []
    real_call = redis.commands.core.AsyncScript.__call__

    async def counting(self: Any, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        calls.append(list(args or []))
        return await real_call(self, keys, args, client)

    monkeypatch.setattr(redis.commands.core.AsyncScript, "__call__", counting)
    store = RedisBucketStore(
        client, prefix, server_time=False, loop_client=lambda: redis.asyncio.Redis.from_url(REDIS_URL)
    )
    rate, now = Rate(per_s=1, burst=5), 1_700_000_000.0

    async def storm() -> list[Any]:
        return list(await asyncio.gather(*(store.take_on_loop("busy", rate, now) for _ in range(9))))

    got = asyncio.run(storm())
    bucket: Bucket | None = None
    for g in got:
        expected, bucket = take(bucket, rate, now)
        assert (g.allowed, g.remaining, g.retry_after_s) == pytest.approx(
            (expected.allowed, expected.remaining, expected.retry_after_s), abs=1e-9
        )
    assert [g.allowed for g in got] == [True] * 5 + [False] * 4
    # the sender runs once all 9 have queued: one call taking 9 tokens
    assert [c[-1] for c in calls] == ["9"], calls
