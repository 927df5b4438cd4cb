"""Per-provider admission health, derived from the attempts table on every scheduling round.

Submits run in worker processes and dispatch in scheduler processes; deriving the circuit breaker and the AIMD
throttle from recorded attempt outcomes (instead of process memory) makes every scheduler see the same picture
and survive restarts. The pure rules live in `domain.breaker` and `domain.throttle`; this module only feeds
them the recent history.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from aivedio_engine.config import Settings
from aivedio_engine.db import capacity
from aivedio_engine.db.capacity import AttemptOutcome
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.breaker import Breaker, counts_as_failure
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.status import AttemptStatus
from aivedio_engine.domain.throttle import Throttle

#: how far back a 429 still shrinks a provider's capacity
THROTTLE_MEMORY = timedelta(seconds=60)
_RETRY_AFTER = re.compile(r"retry-after=(\d+(?:\.\d+)?)")


def error_code_with_retry_after(code: str | None, retry_after_s: float | None) -> str | None:
    """Rate-limit answers keep their Retry-After in the attempt's error code, so any scheduler can honour it."""
    if retry_after_s is None:
        return code
    return f"{code or 'rate_limited'};retry-after={retry_after_s:g}"[:128]


@dataclass(frozen=True)
class Health:
    breakers: dict[str, Breaker]
    throttles: dict[str, Throttle]
    #: attempts handed to the provider whose outcome is not known yet (a half-open breaker's probe)
    sending: dict[str, int]


def provider_health(engine: Engine, settings: Settings, now: datetime, window: int = 20) -> Health:
    breakers: dict[str, Breaker] = {}
    throttles: dict[str, Throttle] = {}
    sending: dict[str, int] = {}
    with engine.connect() as conn:
        for name, cfg in settings.providers.items():
            if not cfg.enabled:
                continue
            rows = capacity.decided_attempts(conn, name, window)
            breakers[name] = _breaker(reversed(rows))
            throttles[name] = _throttle(rows, cfg.max_concurrency, now)
            sending[name] = capacity.sending_count(conn, name)
    return Health(breakers, throttles, sending)


def _failed(row: AttemptOutcome) -> bool:
    if row.submit_state == AttemptStatus.UNKNOWN.value:
        return True
    if row.submit_state != AttemptStatus.FAILED_BEFORE_ACCEPT.value or row.last_error_class is None:
        return False
    try:
        return counts_as_failure(ErrorClass(row.last_error_class))
    except ValueError:
        return False


def _breaker(rows: Iterable[AttemptOutcome]) -> Breaker:
    breaker = Breaker()
    for row in rows:
        breaker = breaker.record(_failed(row), row.updated_at)
    return breaker


def _throttle(rows: Sequence[AttemptOutcome], max_capacity: int, now: datetime) -> Throttle:
    throttle = Throttle.at_max(max_capacity)
    limited = [
        r
        for r in rows
        if r.last_error_class == ErrorClass.PROVIDER_RATE_LIMITED.value and now - r.updated_at <= THROTTLE_MEMORY
    ]
    for row in sorted(limited, key=lambda r: r.updated_at):
        match = _RETRY_AFTER.search(row.provider_error_code or "")
        retry_after = float(match.group(1)) if match else None
        throttle = throttle.on_throttled(row.updated_at, retry_after)
    return throttle
