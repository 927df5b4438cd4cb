"""Per-tenant limits at the door: the request rate limit of POST /v1/generations, and the tier a request's
`priority` is capped at.

A tenant's limits are read once per `api.auth_cache_ttl_s` per process (like its API keys), so the hot create
path does not pay a query for them, and `aivedio tenants update` reaches every API process within that time.
"""

from __future__ import annotations

import math
import threading
import uuid
from dataclasses import dataclass

from aivedio_engine.clock import Clock
from aivedio_engine.domain.ratelimit import Rate, Verdict
from aivedio_engine.observability.metrics import REQUESTS_RATE_LIMITED
from aivedio_engine.ratelimit import BucketStore
from aivedio_engine.services.errors import RateLimited
from aivedio_engine.services.tenants import EffectiveLimits, TenantService


class TenantLimitCache:
    MAX_ENTRIES = 10_000

    def __init__(self, tenants: TenantService, clock: Clock, ttl_s: float) -> None:
        self._tenants = tenants
        self._clock = clock
        self._ttl_s = ttl_s
        self._entries: dict[uuid.UUID, tuple[EffectiveLimits, float]] = {}
        self._lock = threading.Lock()

    def get(self, tenant_id: uuid.UUID) -> EffectiveLimits:
        cached = self.cached(tenant_id)
        if cached is not None:
            return cached
        now = self._clock.now().timestamp()
        limits = self._tenants.effective(self._tenants.limits(tenant_id))
        if self._ttl_s > 0:
            with self._lock:
                if len(self._entries) >= self.MAX_ENTRIES:
                    self._entries.clear()
                self._entries[tenant_id] = (limits, now + self._ttl_s)
        return limits

    def cached(self, tenant_id: uuid.UUID) -> EffectiveLimits | None:
        """The tenant's limits if this process holds them and they are fresh; None: `get` would read them."""
        hit = self._entries.get(tenant_id)
        return hit[0] if hit is not None and self._clock.now().timestamp() < hit[1] else None

    def cached_tier(self, tenant_id: uuid.UUID) -> int | None:
        limits = self.cached(tenant_id)
        return None if limits is None else limits.priority_tier

    def tier(self, tenant_id: uuid.UUID) -> int:
        return self.get(tenant_id).priority_tier


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: float
    rate: Rate

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1: a client that waits this long finds a token."""
        return str(max(1, math.ceil(self.retry_after_s)))

    def check(self) -> None:
        """Raise RateLimited (429) unless the token was granted: before anything is read or written (no task, no
        reservation, and the Idempotency-Key stays free for the retry)."""
        if not self.allowed:
            raise RateLimited(
                f"this tenant may create {self.rate.per_s:g} generations per second "
                f"(bursts of {self.rate.burst:g}); retry in {self.retry_after_header} s",
                retry_after_s=round(self.retry_after_s, 3),
            )


class RequestRateLimiter:
    def __init__(self, limits: TenantLimitCache, store: BucketStore, clock: Clock) -> None:
        self._limits = limits
        self._store = store
        self._clock = clock

    def take(self, tenant_id: uuid.UUID, action: str = "generations") -> RateDecision:
        """Take one token from the tenant's bucket for `action`; a refusal has changed nothing else."""
        eff = self._limits.get(tenant_id)
        rate = Rate(eff.rate_limit_per_s, eff.rate_limit_burst)
        verdict: Verdict = self._store.take(f"tenant:{tenant_id}:{action}", rate, self._clock.now().timestamp())
        return self._decided(verdict, rate, action)

    async def take_on_loop(self, tenant_id: uuid.UUID, action: str = "generations") -> RateDecision | None:
        """`take` for an event loop; None when the tenant's limits are not cached (`take` reads them, blocking)."""
        eff = self._limits.cached(tenant_id)
        if eff is None:
            return None
        rate = Rate(eff.rate_limit_per_s, eff.rate_limit_burst)
        now = self._clock.now().timestamp()
        return self._decided(await self._store.take_on_loop(f"tenant:{tenant_id}:{action}", rate, now), rate, action)

    def _decided(self, verdict: Verdict, rate: Rate, action: str) -> RateDecision:
        if not verdict.allowed:
            REQUESTS_RATE_LIMITED.labels(action).inc()
        return RateDecision(verdict.allowed, verdict.retry_after_s, rate)
