"""The shared bucket store, or, while it is unreachable, a conservative bucket of this process's own.

Each API process then limits on its own, knowing nothing of the others, so it grants only `share` of the
tenant's rate and burst (api.tenant_rate_fallback_share; 1/N for N API processes keeps the total at the
configured rate). After a failure the shared store is left alone for `retry_s`, so a dead Redis costs one
timeout per process per `retry_s`, not one per request.
"""

from __future__ import annotations

import logging
import threading
from typing import Literal

from aivedio_engine.domain.ratelimit import Rate, Verdict
from aivedio_engine.ratelimit import BucketStore
from aivedio_engine.ratelimit.memory import MemoryBucketStore

log = logging.getLogger("aivedio.ratelimit")


class FallbackBucketStore:
    def __init__(
        self,
        primary: BucketStore,
        *,
        share: float,
        errors: tuple[type[BaseException], ...],
        retry_s: float = 1.0,
    ) -> None:
        self._primary = primary
        self._local = MemoryBucketStore()
        self._share = share
        self._errors = errors
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._down_until: float | None = None

    @property
    def degraded(self) -> bool:
        """True while limits are kept per process (the shared store failed and is not yet retried)."""
        return self._down_until is not None

    def take(self, key: str, rate: Rate, now: float) -> Verdict:
        down_until = self._primary_due(now)
        if down_until is not False:
            try:
                verdict = self._primary.take(key, rate, now)
            except self._errors as exc:
                self._failed(exc, now)
            else:
                self._answered(down_until)
                return verdict
        return self._local.take(key, rate.share(self._share), now)

    async def take_on_loop(self, key: str, rate: Rate, now: float) -> Verdict:
        down_until = self._primary_due(now)
        if down_until is not False:
            try:
                verdict = await self._primary.take_on_loop(key, rate, now)
            except self._errors as exc:
                self._failed(exc, now)
            else:
                self._answered(down_until)
                return verdict
        return self._local.take(key, rate.share(self._share), now)

    def _primary_due(self, now: float) -> float | None | Literal[False]:
        """False: the shared store failed lately and is left alone; else when it was last found down (None: it
        was not)."""
        with self._lock:
            down_until = self._down_until
        return down_until if down_until is None or now >= down_until else False

    def _failed(self, exc: BaseException, now: float) -> None:
        with self._lock:
            if self._down_until is None:
                log.warning(
                    "rate limit store unreachable (%s); limiting per process at %g of each rate",
                    type(exc).__name__,
                    self._share,
                )
            self._down_until = now + self._retry_s

    def _answered(self, down_until: float | None) -> None:
        if down_until is not None:
            with self._lock:
                self._down_until = None
            log.warning("rate limit store reachable again; limits are shared again")
