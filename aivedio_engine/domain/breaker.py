"""Circuit breaker per provider, pure: stop sending new submits to a provider that keeps failing.

Numbers: open after 5 consecutive failures, or when ≥ 50 % of the last 20 calls failed
— judged only once `min_calls` results are in the window, so one failure out of one call does not open it.
After 30 s one probe is let through (half-open); its success closes the breaker, its failure re-opens it for
another 30 s. A probe that never reports (its process died) is replaced by a new one after another 30 s.

Only submits are gated. Queries and cancels continue while the breaker is open: they bring home jobs already
running at the provider and let users stop paying for them. The breaker also never moves a
task to another provider; whether that is allowed (pinned provider, SUBMIT_UNKNOWN) is `domain.provider_switch`.

Results that arrive while the breaker is open and cooling down are stragglers of calls sent before it opened:
they are ignored, so they can neither close it early nor extend the cooldown. Once half-open, the first result
decides.

Values are immutable: every method returns the next breaker, so the caller owns storage and concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from aivedio_engine.domain.retry import ErrorClass

#: failures that say the provider is unhealthy. A refused prompt (4xx, moderation) is a healthy provider doing
#: its job; a 429 is throttling, handled by `throttle`; local errors say nothing about the provider.
FAILURE_CLASSES: frozenset[ErrorClass] = frozenset(
    {ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, ErrorClass.CONNECT_FAILED, ErrorClass.SUBMIT_AMBIGUOUS}
)


def counts_as_failure(error: ErrorClass) -> bool:
    return error in FAILURE_CLASSES


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    consecutive_failures: int = 5
    window: int = 20
    failure_ratio: float = 0.5
    min_calls: int = 10
    open_s: float = 30.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.window < 1 or not 1 <= self.min_calls <= self.window:
            raise ValueError("need consecutive_failures >= 1 and 1 <= min_calls <= window")
        if not 0 < self.failure_ratio <= 1 or self.open_s <= 0:
            raise ValueError("need 0 < failure_ratio <= 1 and open_s > 0")


@dataclass(frozen=True, slots=True)
class Breaker:
    policy: BreakerPolicy = field(default_factory=BreakerPolicy)
    state: BreakerState = BreakerState.CLOSED
    consecutive: int = 0
    #: outcomes of the last `policy.window` calls while closed, oldest first; True = failure
    recent: tuple[bool, ...] = ()
    opened_at: datetime | None = None
    probe_started_at: datetime | None = None

    def status(self, now: datetime) -> BreakerState:
        """The state as of `now`: an open breaker whose cooldown has passed is half-open."""
        if self.state is BreakerState.OPEN and self.opened_at is not None and now >= self._after(self.opened_at):
            return BreakerState.HALF_OPEN
        return self.state

    def allows_submit(self, now: datetime) -> bool:
        status = self.status(now)
        if status is BreakerState.CLOSED:
            return True
        if status is BreakerState.OPEN:
            return False
        return self.probe_started_at is None or now >= self._after(self.probe_started_at)

    def submit_budget(self, now: datetime) -> int | None:
        """New submits allowed now: None = no limit (closed), 1 = the probe, 0 = none. Feeds admission.select."""
        if self.status(now) is BreakerState.CLOSED:
            return None
        return 1 if self.allows_submit(now) else 0

    def begin_submit(self, now: datetime) -> tuple[bool, Breaker]:
        """Ask to send one submit; in half-open this reserves the single probe."""
        if not self.allows_submit(now):
            return False, self
        if self.status(now) is BreakerState.HALF_OPEN:
            return True, replace(self, state=BreakerState.HALF_OPEN, probe_started_at=now)
        return True, self

    def record(self, failed: bool, now: datetime) -> Breaker:
        status = self.status(now)
        if status is BreakerState.OPEN:
            return self
        if status is BreakerState.HALF_OPEN:
            return self._open(now) if failed else Breaker(self.policy)
        consecutive = self.consecutive + 1 if failed else 0
        recent = (*self.recent, failed)[-self.policy.window :]
        if consecutive >= self.policy.consecutive_failures or self._ratio_exceeded(recent):
            return self._open(now)
        return replace(self, consecutive=consecutive, recent=recent)

    def on_success(self, now: datetime) -> Breaker:
        return self.record(False, now)

    def on_failure(self, now: datetime) -> Breaker:
        return self.record(True, now)

    def _ratio_exceeded(self, recent: tuple[bool, ...]) -> bool:
        return len(recent) >= self.policy.min_calls and sum(recent) >= self.policy.failure_ratio * len(recent)

    def _open(self, now: datetime) -> Breaker:
        # the window restarts empty after the breaker closes again: old failures already had their effect
        return Breaker(self.policy, BreakerState.OPEN, opened_at=now)

    def _after(self, start: datetime) -> datetime:
        return start + timedelta(seconds=self.policy.open_s)
