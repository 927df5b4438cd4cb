"""The shared Redis server for tests: its URL, and a private key prefix per test whose keys are deleted after."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.support.workers import worker_id

REDIS_URL = os.environ.get("AIVEDIO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def private_prefix(label: str) -> Iterator[str]:
    """Yield `aivedio-<worker>-<label>-<random>:`; skip when Redis is down (fail under CI=true); clean up after."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"Redis unreachable at {REDIS_URL}: {exc}")
    prefix = f"aivedio-{worker_id()}-{label}-{uuid.uuid4().hex[:10]}:"
    yield prefix
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    client.close()
