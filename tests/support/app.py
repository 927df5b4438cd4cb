"""App contexts for tests: embedded (SQLite in a tmp dir) and PostgreSQL, with a tenant and a key."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate


class FakeClock:
    """The engine's clock under test control: time moves only when a test advances it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)


def make_context(data_dir: Path, database_url: str | None = None, clock: Any = None, **overrides: Any) -> AppContext:
    values: dict[str, Any] = {"data_dir": str(data_dir), **overrides}
    if database_url:
        values.setdefault("database", {})["url"] = database_url
    ctx = build_context(load_settings(None, values), clock=clock)
    migrate.upgrade(ctx.engine)
    return ctx


def distributed_context(data_dir: Path, database_url: str, prefix_name: str, **overrides: Any) -> Iterator[AppContext]:
    """A distributed-mode context on `database_url` whose Redis keys live under a private prefix (removed after);
    `yield from` it in a fixture."""
    from tests.support.redis import private_prefix

    for prefix in private_prefix(prefix_name):
        ctx = make_context(data_dir, database_url, mode="distributed", redis={"key_prefix": prefix}, **overrides)
        try:
            yield ctx
        finally:
            ctx.close()


@dataclass
class TenantKey:
    tenant_id: Any
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def tenant_with_key(ctx: AppContext, name: str, credits: str | int = 1000) -> TenantKey:
    tenant = ctx.tenants.create(name, Decimal(str(credits)))
    _, key = ctx.tenants.create_key(tenant.id)
    return TenantKey(tenant.id, key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_api(ctx: AppContext, port: int | None = None) -> Iterator[str]:
    """The real API on a loopback port (`port`, e.g. the one `api.public_base_url` names; default a free one), in
    a thread; yields its base URL and stops it afterwards."""
    import httpx
    import uvicorn

    from aivedio_engine.api.app import create_app

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    ready = threading.Event()
    for _ in range(200):  # wait on the condition (server answers), bounded to ~10 s
        try:
            if httpx.get(base + "/healthz", timeout=0.5).status_code == 200:
                ready.set()
                break
        except httpx.TransportError:
            ready.wait(0.05)
    assert ready.is_set(), "API did not start"
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)
