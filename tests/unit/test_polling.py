"""Polling intervals and the reconciliation schedule, with time injected."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.domain.polling import LookupVerdict, PollPolicy, ReconcilePolicy, next_poll_at, reconcile_step

T0 = datetime(2026, 5, 1, tzinfo=UTC)
S = timedelta(seconds=1)


@given(age=st.floats(0, 10_000), seed=st.integers(0, 1000))
def test_poll_interval_is_at_least_the_floor_and_at_most_max_plus_jitter(age: float, seed: int) -> None:
    p = PollPolicy()
    now = T0 + timedelta(seconds=age)
    delay = (next_poll_at(p, submitted_at=T0, now=now, rng=random.Random(seed)) - now).total_seconds()
    assert p.min_interval_s * (1 - p.jitter) <= delay <= p.max_interval_s * (1 + p.jitter)


def test_interval_grows_with_age_and_shrinks_when_urgent() -> None:
    p = PollPolicy(jitter=0)
    young = next_poll_at(p, submitted_at=T0, now=T0 + 10 * S, rng=random.Random(1)) - (T0 + 10 * S)
    old = next_poll_at(p, submitted_at=T0, now=T0 + 600 * S, rng=random.Random(1)) - (T0 + 600 * S)
    assert young == 5 * S and old == 60 * S
    now = T0 + 600 * S
    expiring = next_poll_at(p, submitted_at=T0, now=now, rng=random.Random(1), url_expires_at=now + 30 * S)
    cancel = next_poll_at(p, submitted_at=T0, now=now, rng=random.Random(1), cancel_pending=True)
    assert expiring - now == cancel - now == 5 * S


def test_jitter_spreads_jobs_submitted_together() -> None:
    p = PollPolicy()
    times = {next_poll_at(p, submitted_at=T0, now=T0 + 100 * S, rng=random.Random(i)) for i in range(50)}
    assert len(times) > 40


def test_reconcile_schedule_10s_60s_5min_then_park() -> None:
    p = ReconcilePolicy()
    step = lambda now, n, last=None, nf=None: reconcile_step(  # noqa: E731
        p, sent_at=T0, now=now, lookups_done=n, last_lookup_at=last, last_not_found_at=nf
    )
    assert step(T0 + 5 * S, 0) == (LookupVerdict.WAIT, T0 + 10 * S)
    assert step(T0 + 10 * S, 0) == (LookupVerdict.LOOK_UP, None)
    # an early "not found" (inside the visibility lag) does not count as "not created"
    assert step(T0 + 11 * S, 1, T0 + 10 * S, T0 + 10 * S) == (LookupVerdict.WAIT, T0 + 60 * S)
    assert step(T0 + 60 * S, 1, T0 + 10 * S, T0 + 10 * S)[0] is LookupVerdict.LOOK_UP
    assert step(T0 + 61 * S, 2, T0 + 60 * S, T0 + 60 * S)[0] is LookupVerdict.CONFIRMED_NOT_CREATED
    # lookups that never answer: retried, then parked at 15 min, never confirmed
    assert step(T0 + 300 * S, 2, T0 + 60 * S)[0] is LookupVerdict.LOOK_UP
    assert step(T0 + 700 * S, 3, T0 + 600 * S) == (LookupVerdict.WAIT, T0 + 900 * S)
    assert step(T0 + 900 * S, 3, T0 + 600 * S) == (LookupVerdict.PARK, None)
