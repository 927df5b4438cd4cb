"""Effective provider capacity, pure: additive increase, multiplicative decrease (AIMD), plus Retry-After.

A provider's configured `max_concurrency` is what its contract promises; what it accepts right now can be less
(shared account, vendor-side incident). A 429 / THROTTLED / IN_QUEUE answer halves the capacity we use (never
below 1, so the provider is still probed and can recover), each accepted submit adds one back, up to the
configured maximum — the TCP congestion-control shape, which converges without knowing the real limit.

One overload event often answers several in-flight submits with 429 at once. Halving once per answer would
take 64 slots to 1 in a burst, so decreases are at most one per `decrease_hold_s` (TCP likewise reacts once per
round trip). Retry-After is honoured separately as an instant before which no new submit is sent at all; the
latest instant wins and it is capped, so a broken header cannot block a provider for days.

Feed `capacity(now)` into `admission.Limits.providers` (as min with the configured max) and use
`can_submit(now)` for the submit budget. Immutable: every method returns the next value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime


@dataclass(frozen=True, slots=True)
class ThrottlePolicy:
    decrease_factor: float = 0.5
    increase_step: int = 1
    decrease_hold_s: float = 1.0
    max_retry_after_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.decrease_factor < 1 or self.increase_step < 1:
            raise ValueError("need 0 < decrease_factor < 1 and increase_step >= 1")
        if self.decrease_hold_s < 0 or self.max_retry_after_s <= 0:
            raise ValueError("need decrease_hold_s >= 0 and max_retry_after_s > 0")


@dataclass(frozen=True, slots=True)
class Throttle:
    max_capacity: int
    effective: int
    blocked_until: datetime | None = None
    last_decrease_at: datetime | None = None
    policy: ThrottlePolicy = field(default_factory=ThrottlePolicy)

    def __post_init__(self) -> None:
        if self.max_capacity < 1 or not 1 <= self.effective <= self.max_capacity:
            raise ValueError("need 1 <= effective <= max_capacity")

    @classmethod
    def at_max(cls, max_capacity: int, policy: ThrottlePolicy | None = None) -> Throttle:
        return cls(max_capacity, max_capacity, policy=policy or ThrottlePolicy())

    def can_submit(self, now: datetime) -> bool:
        return self.blocked_until is None or now >= self.blocked_until

    def capacity(self, now: datetime) -> int:
        """Slots to use now: 0 until Retry-After has passed, else the AIMD estimate."""
        return self.effective if self.can_submit(now) else 0

    def on_throttled(self, now: datetime, retry_after: float | datetime | None = None) -> Throttle:
        """A 429 / THROTTLED / IN_QUEUE answer; `retry_after` in seconds or as an instant (see parse_retry_after)."""
        blocked_until = self.blocked_until
        until = self._until(now, retry_after)
        if until is not None and (blocked_until is None or until > blocked_until):
            blocked_until = until
        held = self.last_decrease_at is not None and now - self.last_decrease_at < timedelta(
            seconds=self.policy.decrease_hold_s
        )
        if held:
            return replace(self, blocked_until=blocked_until)
        effective = max(1, int(self.effective * self.policy.decrease_factor))
        return replace(self, effective=effective, blocked_until=blocked_until, last_decrease_at=now)

    def on_success(self, now: datetime) -> Throttle:  # same signature as the other events
        return replace(self, effective=min(self.max_capacity, self.effective + self.policy.increase_step))

    def with_max(self, max_capacity: int) -> Throttle:
        """Configuration changed: a lower max applies at once, a higher one is grown into additively."""
        return replace(self, max_capacity=max_capacity, effective=min(self.effective, max_capacity))

    def _until(self, now: datetime, retry_after: float | datetime | None) -> datetime | None:
        if retry_after is None:
            return None
        cap = now + timedelta(seconds=self.policy.max_retry_after_s)
        if isinstance(retry_after, datetime):
            return min(max(retry_after, now), cap)
        if retry_after != retry_after or retry_after <= 0:  # NaN or nothing to wait for
            return None
        return min(now + timedelta(seconds=min(retry_after, self.policy.max_retry_after_s)), cap)


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """RFC 9110 §10.2.3: delay-seconds or an HTTP-date → the instant; None when absent or malformed."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        # clamped so an absurd header cannot overflow datetime; Throttle caps the wait much lower anyway
        return now + timedelta(seconds=min(int(text), 10**8))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=UTC)
    return max(when, now)
