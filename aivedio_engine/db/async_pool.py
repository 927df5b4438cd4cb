"""The API's async PostgreSQL connections: a psycopg pool opened on the API's event loop by its lifespan.

Only the create route's hot path uses it (`services/loop_create.py`): there the thread hop to the blocking pool
cost as much CPU as the create's own statements. Its sessions are in autocommit, where the create's one statement
is its own transaction, and carry the create's lock timeout (`creation.LOOP_SESSION`) besides the blocking
engine's settings (statement timeout, connect timeout).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from aivedio_engine.config import Settings
from aivedio_engine.db.creation import LOOP_SESSION


class LoopPool:
    def __init__(self, settings: Settings) -> None:
        db = settings.database
        url = make_url(settings.database_url).set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self._kwargs = {
            "autocommit": True,
            "connect_timeout": max(1, math.ceil(db.connect_timeout_s)),
            "options": " ".join(
                f"-c {k}={v}" for k, v in {"statement_timeout": db.statement_timeout_ms, **LOOP_SESSION}.items()
            ),
        }
        self._max_size = db.pool_size
        self._timeout_s = db.connect_timeout_s
        self._pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_connect: list[Callable[[Any], None]] = []
        self._on_checkout: list[Callable[[Any], None]] = []

    def watch(
        self, on_connect: Callable[[Any], None] | None = None, on_checkout: Callable[[Any], None] | None = None
    ) -> None:
        """Be told of each new connection and each checkout (the benchmark traces and counts them, as it does the
        blocking engine's through SQLAlchemy's pool events). Takes effect at the next `open`."""
        if on_connect is not None:
            self._on_connect.append(on_connect)
        if on_checkout is not None:
            self._on_checkout.append(on_checkout)

    async def open(self) -> None:
        """Open on the running loop (the API's lifespan); until then, and after `close`, `current` is None."""
        from psycopg_pool import AsyncConnectionPool

        await self.close()
        pool = AsyncConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._max_size,
            timeout=self._timeout_s,
            open=False,
            name="api-loop",
            configure=self._connected if self._on_connect else None,
            check=self._checked_out if self._on_checkout else None,
        )
        await pool.open()
        self._pool, self._loop = pool, asyncio.get_running_loop()

    def current(self) -> Any:
        """The pool, if it is open on the running loop: an app served without its lifespan (a test client) or
        on another loop gets None and takes the blocking path."""
        if self._pool is None or self._loop is not asyncio.get_running_loop():
            return None
        return self._pool

    async def _connected(self, conn: Any) -> None:
        for hook in self._on_connect:
            hook(conn)

    async def _checked_out(self, conn: Any) -> None:
        for hook in self._on_checkout:
            hook(conn)

    async def close(self) -> None:
        pool, self._pool, self._loop = self._pool, None, None
        if pool is not None:
            await pool.close()
