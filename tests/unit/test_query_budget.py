"""`[retry.query]` applied to failed polls: backoff within the budget, never under the poll floor, and a spent
budget that keeps polling slowly instead of failing the task."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.domain.polling import PollPolicy, after_query_failure
from aivedio_engine.domain.retry import DEFAULT_BUDGETS, RetryBudget, Step
from aivedio_engine.services.query_budget import Streak, after_failure, streak_of

T0 = datetime(2026, 5, 1, tzinfo=UTC)
POLICY = PollPolicy(min_interval_s=2, max_interval_s=300, jitter=0)
BUDGET = RetryBudget(
    max_attempts=4,
    max_total_wait_s=10_000,
    deadline_s=20_000,
    base_delay_s=10,
    multiplier=2,
    max_delay_s=40,
    provider_switch_allowed=False,
    manual_confirmation_required=False,
)


@given(failures=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_within_the_budget_the_delay_is_the_budgets_backoff_above_the_floor(failures: int, seed: int) -> None:
    now = T0 + timedelta(seconds=100)
    retry = after_query_failure(
        POLICY, BUDGET, failures=failures, first_failure_at=T0, submitted_at=T0, now=now, rng=random.Random(seed)
    )
    delay = (retry.at - now).total_seconds()
    cap = min(BUDGET.max_delay_s, BUDGET.base_delay_s * BUDGET.multiplier ** (failures - 1))
    assert retry.spent is None
    assert POLICY.min_interval_s <= delay <= cap


def test_the_budget_is_spent_after_max_attempts_then_polling_goes_on_at_the_slowest_pace() -> None:
    now = T0 + timedelta(seconds=100)
    retry = after_query_failure(
        POLICY, BUDGET, failures=4, first_failure_at=T0, submitted_at=T0, now=now, rng=random.Random(1)
    )
    assert retry.spent is not None and "4/4" in retry.spent
    assert retry.at == now + timedelta(seconds=POLICY.max_interval_s)


def test_the_budget_is_spent_after_max_total_wait_since_the_first_failure() -> None:
    budget = RetryBudget(**{**BUDGET.as_dict(), "max_total_wait_s": 60})
    now = T0 + timedelta(seconds=61)
    retry = after_query_failure(
        POLICY, budget, failures=2, first_failure_at=T0, submitted_at=T0, now=now, rng=random.Random(1)
    )
    assert retry.spent is not None and "waited more than 60s" in retry.spent


def test_the_streak_is_counted_across_polls_and_kept_on_the_attempt() -> None:
    code = None
    now = T0
    for n in range(1, 4):
        failed = after_failure(POLICY, BUDGET, code, submitted_at=T0, deadline_at=None, now=now, rng=random.Random(n))
        code = failed.code
        assert streak_of(code) == Streak(n, T0)  # the first failure's time is kept
        now = failed.next_poll_at
    assert after_failure(POLICY, BUDGET, code, submitted_at=T0, deadline_at=None, now=now, rng=random.Random()).spent
    assert streak_of(None) is None and streak_of("http_502") is None and len(code) <= 128


def test_default_query_budget_is_what_the_toml_documents() -> None:
    assert DEFAULT_BUDGETS[Step.QUERY].max_attempts == 20
