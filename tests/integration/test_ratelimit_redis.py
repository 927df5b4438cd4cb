"""The Redis token bucket: its Lua script gives the pure function's answers, under the configured prefix."""

from __future__ import annotations

import random
from collections.abc import Iterator

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
