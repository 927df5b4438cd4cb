"""Client webhooks, pure: which events an endpoint wants, which secrets sign, when the next attempt is due.

A client webhook is a Standard Webhooks message (`webhook-id`, `webhook-timestamp`, `webhook-signature`) whose
body is one of the events the SSE stream shows. Everything here takes `now` (and randomness) as arguments.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from aivedio_engine.domain.retry import RetryBudget
from aivedio_engine.domain.status import TaskStatus

#: the `type` of every message sent today: one applied task transition
TASK_STATUS_CHANGED = "task.status.changed"
SECRET_PREFIX = "whsec_"
#: Standard Webhooks asks for 24–64 random bytes
SECRET_BYTES = 32


def parse_event_filter(values: Iterable[str]) -> tuple[str, ...]:
    """`--events` / `events`: task statuses (any case, comma lists allowed); empty or `*` means every change.
    Returns the normalized statuses, () for all. Raises ValueError naming the valid values."""
    chosen: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip().upper()
            if not name:
                continue
            if name in ("*", TASK_STATUS_CHANGED.upper()):
                return ()
            if name not in TaskStatus.__members__:
                known = ", ".join(s.value for s in TaskStatus)
                raise ValueError(f"unknown event {part.strip()!r} (known: *, {known})")
            if name not in chosen:
                chosen.append(name)
    return tuple(chosen)


def wants(event_filter: Sequence[str], status: str) -> bool:
    return not event_filter or status in event_filter


def new_secret(random_bytes: bytes) -> str:
    """A `whsec_` secret from `random_bytes` (the caller draws them from `secrets.token_bytes`)."""
    if len(random_bytes) < 24:
        raise ValueError("a webhook secret needs at least 24 random bytes")
    return SECRET_PREFIX + base64.b64encode(random_bytes).decode("ascii")


def signing_secrets(current: str, previous: str | None, previous_until: datetime | None, now: datetime) -> list[str]:
    """Secrets that sign a message sent at `now`: the current one, and during a rotation's grace period the
    previous one too (one signature each; receivers accept a message if any signature verifies)."""
    live = [current]
    if previous and previous_until is not None and now < previous_until:
        live.append(previous)
    return live


def next_attempt_at(
    budget: RetryBudget, attempts_made: int, first_attempt_at: datetime, now: datetime, rng: random.Random
) -> datetime | None:
    """When to try again after `attempts_made` failed attempts, or None when the budget is spent (→ DEAD).

    Delay n waits between half and all of `budget.delay_cap(n)` ("equal jitter"): full jitter would let most
    of an hours-long budget collapse into a few quick retries during the very outage they should ride out.
    """
    if attempts_made >= budget.max_attempts:
        return None
    cap = budget.delay_cap(attempts_made - 1)
    at = now + timedelta(seconds=rng.uniform(cap / 2, cap))
    waited = (at - first_attempt_at).total_seconds()
    if waited > budget.max_total_wait_s or waited > budget.deadline_s:
        return None
    return at


def is_success(status_code: int) -> bool:
    """Standard Webhooks: any 2xx acknowledges the message; everything else (incl. 3xx, never followed) fails."""
    return 200 <= status_code < 300
