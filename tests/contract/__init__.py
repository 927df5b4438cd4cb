"""Contract suites: one behaviour, every implementation of a Protocol.

Helpers for the slot-store suites live here because the integration tests use them too: a condition wait with
a deadline, the shared Redis (skipped locally when down, required under CI=true), and a private, throwaway
redis-server for the tests that FLUSHALL — never the shared server, whose other users would lose their data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

SHARED_REDIS_URL = os.environ.get("AIVEDIO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {value!r})")
        time.sleep(interval)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def shared_redis() -> redis.Redis:
    client = redis.Redis.from_url(SHARED_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        client.close()
        _unavailable(f"Redis unreachable at {SHARED_REDIS_URL}: {exc}")
    return client


@contextmanager
def private_redis() -> Iterator[redis.Redis]:
    """A redis-server of our own on a unix socket (no port to collide on), without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        _unavailable("redis-server not installed: the FLUSHALL tests need a private server")
    # unix socket paths are limited to ~107 bytes: keep the directory short
    workdir = Path(tempfile.mkdtemp(prefix="avrds", dir="/tmp"))
    sock = workdir / "redis.sock"
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(unix_socket_path=str(sock))
    try:
        wait_until(lambda: sock.exists() and _pings(client), 10, "the private redis-server to answer")
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class FakeClock:
    """Seconds, moved by hand: the memory store's injected clock."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
