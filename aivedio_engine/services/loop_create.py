"""POST /v1/generations on the API's event loop (PostgreSQL).

The blocking create (`GenerationService.create`) runs in a worker thread, and the hand-off to that thread pool
and back cost about as much of the API's CPU as the create's statements themselves (docs/decisions/0011-create-path.md).
Here the common case never leaves the loop: the rate-limit token through an asyncio Redis client, the checks
from this process's caches (`plan_on_loop`), and the create as one autocommit statement on an async psycopg
connection (`db.creation.create_on_loop`); a taken key is read back on the same pool. Whatever needs a blocking
read or the slow reservation — reference assets, a cold cache, a backlog, a short balance stripe — goes to the
thread as before, with the token already taken, so both paths answer alike. With SQLite (embedded mode), or
before the app's lifespan has opened the pool on its loop (a test client used without `with`), every create
takes the thread.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.concurrency import run_in_threadpool

from aivedio_engine.db.async_pool import LoopPool
from aivedio_engine.services.generations import GenerationService
from aivedio_engine.services.rate_limits import RequestRateLimiter
from aivedio_engine.services.task_view import Created


class LoopCreate:
    def __init__(self, generations: GenerationService, limiter: RequestRateLimiter, pool: LoopPool | None) -> None:
        """`pool` None (SQLite): every create runs in the thread pool."""
        self._generations = generations
        self._limiter = limiter
        self._pool = pool

    async def create(
        self, tenant_id: uuid.UUID, idempotency_key: str | None, body: dict[str, Any], trace_id: str | None
    ) -> Created:
        pool = None if self._pool is None else self._pool.current()
        if pool is None:
            return await run_in_threadpool(self._blocking, tenant_id, idempotency_key, body, trace_id, True)
        with self._generations.expecting():  # left before any wait on a thread: the batcher waits for creates only
            decision = await self._limiter.take_on_loop(tenant_id)
            new = None
            if decision is not None:
                decision.check()
                new = await self._generations.plan_on_loop(pool, tenant_id, idempotency_key, body, trace_id)
            created = None if new is None else await self._generations.insert_on_loop(pool, new)
        if decision is None:  # the tenant's limits are not cached: the blocking path reads them
            return await run_in_threadpool(self._blocking, tenant_id, idempotency_key, body, trace_id, True)
        if new is None:
            return await run_in_threadpool(self._blocking, tenant_id, idempotency_key, body, trace_id, False)
        if created is not None:
            return created
        # nothing was written: a taken key to replay, or a stripe too short for the task (the whole balance)
        return await run_in_threadpool(lambda: self._generations.insert(new, whole_balance=True))

    def _blocking(
        self,
        tenant_id: uuid.UUID,
        idempotency_key: str | None,
        body: dict[str, Any],
        trace_id: str | None,
        take_token: bool,
    ) -> Created:
        if take_token:
            self._limiter.take(tenant_id).check()
        return self._generations.create(tenant_id, idempotency_key, body, trace_id=trace_id)

    async def open(self) -> None:
        """Start creating on the running loop (the API's lifespan: the loop that serves every request)."""
        if self._pool is not None:
            await self._pool.open()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
