"""Request rate limits: token-bucket stores (the math is `domain.ratelimit`). Embedded mode keeps buckets in
process; distributed mode keeps them in Redis, shared by every API process, and falls back to a smaller
in-process bucket per process while Redis is unreachable (`fallback.py`)."""

from __future__ import annotations

from typing import Protocol

from aivedio_engine.config import Settings
from aivedio_engine.domain.ratelimit import Rate, Verdict


class BucketStore(Protocol):
    def take(self, key: str, rate: Rate, now: float) -> Verdict:
        """Take one token from bucket `key` at `now` (seconds; a store on a shared server may use its own
        clock instead)."""
        ...

    async def take_on_loop(self, key: str, rate: Rate, now: float) -> Verdict:
        """`take` for an event loop: the same bucket, without blocking it."""
        ...


def build_bucket_store(settings: Settings) -> BucketStore:
    """Embedded mode: in process; distributed mode: Redis with the in-process fallback."""
    from aivedio_engine.ratelimit.memory import MemoryBucketStore

    if settings.mode != "distributed":
        return MemoryBucketStore()
    from aivedio_engine.ratelimit.fallback import FallbackBucketStore
    from aivedio_engine.ratelimit.redis import RedisBucketStore  # redis is only loaded when it is used

    return FallbackBucketStore(
        RedisBucketStore.from_url(settings.redis.url, key_prefix=settings.redis.key_prefix),
        share=settings.api.tenant_rate_fallback_share,
        errors=RedisBucketStore.UNREACHABLE,
    )


__all__ = ["BucketStore", "build_bucket_store"]
