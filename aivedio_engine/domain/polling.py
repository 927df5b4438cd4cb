"""Polling and reconciliation timing, pure.

Callbacks come first; polling is the recovery path. A job is polled no sooner than `min_interval` after
submission, the interval grows with the job's age (old jobs rarely change), ±jitter spreads the load so
thousands of jobs do not poll on the same second, and the interval shrinks when an output URL is about to
expire or a cancel is pending, because then a late answer costs money.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from aivedio_engine.domain.retry import ErrorClass, FailureContext, RetryBudget, Verdict, decide_retry


@dataclass(frozen=True, slots=True)
class PollPolicy:
    min_interval_s: float = 5.0
    max_interval_s: float = 60.0
    jitter: float = 0.2
    #: the interval is this fraction of the job's age, between the bounds
    age_factor: float = 0.25
    #: boost when an output URL expires within this window, or a cancel is pending
    urgent_window_s: float = 120.0


def next_poll_at(
    policy: PollPolicy,
    *,
    submitted_at: datetime,
    now: datetime,
    rng: random.Random,
    url_expires_at: datetime | None = None,
    cancel_pending: bool = False,
) -> datetime:
    age = max(0.0, (now - submitted_at).total_seconds())
    base = min(policy.max_interval_s, max(policy.min_interval_s, age * policy.age_factor))
    urgent = cancel_pending or (
        url_expires_at is not None and (url_expires_at - now).total_seconds() <= policy.urgent_window_s
    )
    if urgent:
        base = policy.min_interval_s
    delay = base * (1 + rng.uniform(-policy.jitter, policy.jitter))
    # jitter may not take us under the floor the vendors ask for (Runway: ≥ 5 s)
    return now + timedelta(seconds=max(policy.min_interval_s * (1 - policy.jitter), delay))


@dataclass(frozen=True, slots=True)
class QueryRetry:
    at: datetime
    #: why the query budget is spent (raise an alert), None while it is not
    spent: str | None = None


def after_query_failure(
    policy: PollPolicy,
    budget: RetryBudget,
    *,
    failures: int,
    first_failure_at: datetime,
    submitted_at: datetime,
    now: datetime,
    rng: random.Random,
    task_deadline_at: datetime | None = None,
) -> QueryRetry:
    """When to query a job again after `failures` consecutive failed queries (`[retry.query]`:
    retry with backoff, no state change).

    Within the budget the delay is the budget's backoff, never under the poll floor the vendors ask for. A spent
    budget does not fail the task: the job may still finish at the provider and its callback may still come, so
    the query goes on at the slowest poll interval and the caller raises an alert.
    """
    ctx = FailureContext(ErrorClass.QUERY_FAILED, failures, first_failure_at, submitted_at, task_deadline_at)
    decision = decide_retry(ctx, budget, now, rng)
    if decision.verdict is Verdict.RETRY and decision.retry_at is not None:
        return QueryRetry(max(decision.retry_at, now + timedelta(seconds=policy.min_interval_s)))
    return QueryRetry(now + timedelta(seconds=policy.max_interval_s), decision.reason)


class LookupVerdict(StrEnum):
    WAIT = "wait"  # the next lookup is not due yet
    LOOK_UP = "look_up"  # ask the provider by request key now
    CONFIRMED_NOT_CREATED = "confirmed_not_created"  # safe to create a new attempt
    PARK = "park"  # still unknown after the window: a human decides; never resubmit blindly


@dataclass(frozen=True, slots=True)
class ReconcilePolicy:
    lookup_after_s: tuple[float, ...] = (10.0, 60.0, 300.0)
    park_after_s: float = 900.0
    #: a "not found" younger than this may be the vendor's visibility lag, not absence
    visibility_lag_s: float = 60.0


def not_created_from(policy: ReconcilePolicy, sent_at: datetime, send_bound_s: float) -> datetime:
    """The earliest moment "the vendor has no such job" can be believed of a send claimed at `sent_at`: before, the
    request may still be on its way, or its job not yet visible to the vendor's own lookups."""
    return sent_at + timedelta(seconds=send_bound_s + policy.visibility_lag_s)


def reconcile_step(
    policy: ReconcilePolicy,
    *,
    sent_at: datetime,
    now: datetime,
    lookups_done: int,
    last_lookup_at: datetime | None,
    last_not_found_at: datetime | None,
    send_bound_s: float = 0.0,
) -> tuple[LookupVerdict, datetime | None]:
    """What to do with an ambiguous submit now, and (for WAIT) when to come back.

    `sent_at` is when the send was claimed; the request may leave up to `send_bound_s` later and still reach the
    vendor. "Not created" is only believed from a lookup made at least `send_bound_s + visibility_lag_s` after
    the claim (`not_created_from`); earlier misses only lead to the next scheduled lookup. Lookups that fail to
    answer are repeated at the last spacing until the park deadline.
    """
    if last_not_found_at is not None and last_not_found_at >= not_created_from(policy, sent_at, send_bound_s):
        return LookupVerdict.CONFIRMED_NOT_CREATED, None
    park_at = sent_at + timedelta(seconds=policy.park_after_s)
    if now >= park_at:
        return LookupVerdict.PARK, None
    if lookups_done < len(policy.lookup_after_s):
        due = sent_at + timedelta(seconds=policy.lookup_after_s[lookups_done])
    else:
        spacing = policy.lookup_after_s[-1] if policy.lookup_after_s else 60.0
        due = (last_lookup_at or sent_at) + timedelta(seconds=spacing)
    if now >= due:
        return LookupVerdict.LOOK_UP, None
    return LookupVerdict.WAIT, min(due, park_at)
