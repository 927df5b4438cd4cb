"""Token bucket, pure: the per-tenant request rate limit in front of POST /v1/generations.

A bucket holds at most `burst` tokens and gains `per_s` tokens a second; a request takes one token or is
refused, and a refusal says how long until a token will be there (the client's Retry-After). Over any window of
T seconds a bucket that starts full therefore admits at most `burst + per_s * T` requests, however they are
spread. The stores in `aivedio_engine.ratelimit` keep the state (in process, or in Redis, whose Lua script is
this function written again); time is the caller's `now`, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a token short by less than this is a rounding error, not a refusal (`per_s * elapsed` in floating point)
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Rate:
    per_s: float
    burst: float

    def __post_init__(self) -> None:
        if not self.per_s > 0 or not self.burst >= 1:
            raise ValueError(f"a rate needs per_s > 0 and burst >= 1, got {self.per_s}/{self.burst}")

    def share(self, fraction: float) -> Rate:
        """This rate cut to `fraction`, keeping a burst of at least one request (a bucket that can never hold a
        token would refuse everything, which is an outage, not a limit)."""
        return Rate(self.per_s * fraction, max(1.0, self.burst * fraction))

    def refill_s(self) -> float:
        """Seconds an empty bucket takes to fill: after this long, a forgotten bucket equals a new one."""
        return self.burst / self.per_s


@dataclass(frozen=True, slots=True)
class Bucket:
    tokens: float
    #: when `tokens` was computed (the caller's clock, seconds)
    at: float


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    #: tokens left after this request
    remaining: float
    #: 0 when allowed; else seconds until the bucket holds `cost` tokens
    retry_after_s: float


def take(bucket: Bucket | None, rate: Rate, now: float, cost: float = 1.0) -> tuple[Verdict, Bucket]:
    """Try to take `cost` tokens at `now`. `bucket` None is a tenant not seen (or forgotten): a full bucket.

    A clock that steps back refills nothing and does not move `at` back, so the same seconds are never
    counted twice when it steps forward again.
    """
    if bucket is None:
        tokens, at = rate.burst, now
    else:
        elapsed = max(0.0, now - bucket.at)
        tokens, at = min(rate.burst, bucket.tokens + elapsed * rate.per_s), max(bucket.at, now)
    if tokens + EPSILON >= cost:
        left = max(0.0, tokens - cost)
        return Verdict(True, left, 0.0), Bucket(left, at)
    return Verdict(False, tokens, (cost - tokens) / rate.per_s), Bucket(tokens, at)
