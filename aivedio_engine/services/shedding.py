"""Load shedding at the door: while the broker path
is stalled, a create is refused with 503 + Retry-After instead of reserving credits for work nobody will start.

The signal is the age of the oldest due outbox row. It moves in seconds, so each process re-reads it at most
once a second (engine time) rather than adding a query to every create. Replays of existing idempotency keys
are answered before this gate, so a client retrying a request that did get in still sees its task.
"""

from __future__ import annotations

import threading
import uuid
from datetime import datetime
from typing import Any

from aivedio_engine.config import LimitsSettings
from aivedio_engine.db import outbox
from aivedio_engine.db import tenants as tenant_repo
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.admission import PriorityTier, backlogged, exempt_from_shedding
from aivedio_engine.observability.metrics import CREATES_SHED
from aivedio_engine.services.errors import Overloaded

#: how long a refused client should wait: the relay drains a backlog in seconds once the broker is back
RETRY_AFTER_S = 30
CACHE_S = 1.0


class BacklogGate:
    def __init__(self, limits: LimitsSettings) -> None:
        self._limit_s = limits.shed_outbox_age_s
        self._exempt_up_to = limits.shed_exempt_tier
        self._lock = threading.Lock()
        self._read_at: datetime | None = None
        self._oldest: datetime | None = None

    def check(self, engine: Engine, tenant_id: uuid.UUID, now: datetime) -> None:
        """Raise Overloaded when new work must wait; the tenant's tier is read only while shedding."""
        if self._limit_s <= 0:
            return
        oldest = self._oldest_due(engine, now)
        age = (now - oldest).total_seconds() if oldest is not None else None
        if not backlogged(age, self._limit_s):
            return
        with engine.connect() as conn:
            tier = tenant_repo.priority_tier(conn, tenant_id)
        if exempt_from_shedding(tier or PriorityTier.PAID, self._exempt_up_to):
            return
        CREATES_SHED.inc()
        raise Overloaded(
            f"not accepting new generations: queued work has waited {age:.0f} s for the broker "
            f"(limit {self._limit_s:g} s); retry later",
            retry_after_s=RETRY_AFTER_S,
        )

    async def open_on_loop(self, pool: Any, now: datetime) -> bool:
        """True when new work may come in, with the signal read (when due) on the API's loop pool. False: `check`
        must decide, since it reads the tenant's tier while shedding (`GenerationService.plan_on_loop`)."""
        if self._limit_s <= 0:
            return True
        fresh, oldest = self._cached(now)
        if not fresh:
            oldest = self._remember(now, await outbox.oldest_due_on_loop(pool, now))
        return not backlogged((now - oldest).total_seconds() if oldest is not None else None, self._limit_s)

    def _oldest_due(self, engine: Engine, now: datetime) -> datetime | None:
        fresh, oldest = self._cached(now)
        if fresh:
            return oldest
        with engine.connect() as conn:
            return self._remember(now, outbox.oldest_due(conn, now))

    def _cached(self, now: datetime) -> tuple[bool, datetime | None]:
        """(whether this process's reading is under CACHE_S old, the reading)."""
        with self._lock:
            fresh = self._read_at is not None and 0 <= (now - self._read_at).total_seconds() < CACHE_S
            return fresh, self._oldest

    def _remember(self, now: datetime, oldest: datetime | None) -> datetime | None:
        with self._lock:
            self._read_at, self._oldest = now, oldest
        return oldest
