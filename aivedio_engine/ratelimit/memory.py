"""Token buckets in this process (embedded mode, and the fallback while Redis is unreachable)."""

from __future__ import annotations

import threading

from aivedio_engine.domain.ratelimit import Bucket, Rate, Verdict, take


class MemoryBucketStore:
    #: buckets kept before the full ones are forgotten (a forgotten full bucket is the same as a new one)
    MAX_BUCKETS = 10_000

    def __init__(self) -> None:
        self._buckets: dict[str, Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str, rate: Rate, now: float) -> Verdict:
        with self._lock:
            if len(self._buckets) >= self.MAX_BUCKETS and key not in self._buckets:
                self._forget_refilled(rate, now)
            verdict, self._buckets[key] = take(self._buckets.get(key), rate, now)
        return verdict

    async def take_on_loop(self, key: str, rate: Rate, now: float) -> Verdict:
        return self.take(key, rate, now)  # no I/O: the lock is held for microseconds

    def _forget_refilled(self, rate: Rate, now: float) -> None:
        # an approximation across tenants with other rates, erring towards keeping state: a bucket idle for the
        # refill time of this rate may still be refilling at a slower one, so only much older ones go
        horizon = now - 10 * rate.refill_s()
        for key in [k for k, b in self._buckets.items() if b.at < horizon]:
            del self._buckets[key]
