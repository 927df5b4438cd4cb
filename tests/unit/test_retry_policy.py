"""Failure policy: the seed's retry matrix and per-step budgets, with time and randomness injected."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.domain.retry import (
    DEFAULT_BUDGETS,
    RETRY_MATRIX,
    AutoRetry,
    DuplicateRisk,
    ErrorClass,
    FailureContext,
    RetryBudget,
    Step,
    Strategy,
    Verdict,
    decide_retry,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def ctx(error: ErrorClass, attempts: int = 1, **kw: object) -> FailureContext:
    return FailureContext(error_class=error, attempts_made=attempts, first_failure_at=T0, step_started_at=T0, **kw)  # type: ignore[arg-type]


def test_matrix_has_one_row_per_error_class_of_the_seed() -> None:
    assert set(RETRY_MATRIX) == set(ErrorClass)
    assert len(RETRY_MATRIX) == 11  # has eleven rows


@pytest.mark.parametrize(
    ("error", "auto", "risk", "strategy"),
    [
        (ErrorClass.LOCAL_INVALID, AutoRetry.NO, DuplicateRisk.NONE, Strategy.FAIL_FINAL),
        (ErrorClass.PROVIDER_REJECTED, AutoRetry.USUALLY_NO, DuplicateRisk.NONE, Strategy.FAIL_BUSINESS),
        (
            ErrorClass.PROVIDER_RATE_LIMITED,
            AutoRetry.YES_DELAYED,
            DuplicateRisk.LOW,
            Strategy.BACKOFF_HONOUR_RETRY_AFTER,
        ),
        (ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, AutoRetry.YES, DuplicateRisk.LOW, Strategy.BACKOFF),
        (ErrorClass.CONNECT_FAILED, AutoRetry.YES, DuplicateRisk.LOW, Strategy.SHORT_BACKOFF),
        (ErrorClass.SUBMIT_AMBIGUOUS, AutoRetry.NOT_IMMEDIATELY, DuplicateRisk.HIGH, Strategy.RECONCILE),
        (ErrorClass.QUERY_FAILED, AutoRetry.YES, DuplicateRisk.NONE, Strategy.BACKOFF_NO_STATE_CHANGE),
        (
            ErrorClass.CALLBACK_PROCESSING_FAILED,
            AutoRetry.BY_REDELIVERY,
            DuplicateRisk.NONE,
            Strategy.PERSIST_AND_DEDUPE,
        ),
        (ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT, AutoRetry.YES, DuplicateRisk.EXTRA_TRAFFIC, Strategy.REDOWNLOAD),
        (ErrorClass.OUTPUT_URL_EXPIRED, AutoRetry.CONDITIONAL, DuplicateRisk.NONE, Strategy.REFRESH_URL_FIRST),
        (ErrorClass.MEDIA_WORKER_CRASHED, AutoRetry.YES, DuplicateRisk.EXTRA_COMPUTE, Strategy.RERUN_MEDIA),
    ],
)
def test_matrix_rows(error: ErrorClass, auto: AutoRetry, risk: DuplicateRisk, strategy: Strategy) -> None:
    row = RETRY_MATRIX[error]
    assert (row.auto_retry, row.duplicate_risk, row.strategy) == (auto, risk, strategy)


def test_ambiguous_submit_is_never_retried_only_reconciled() -> None:
    budget = DEFAULT_BUDGETS[Step.SUBMIT]
    for attempts in (1, 2, 3, 50):
        d = decide_retry(ctx(ErrorClass.SUBMIT_AMBIGUOUS, attempts), budget, T0, random.Random(1))
        assert d.verdict is Verdict.RECONCILE and d.retry_at is None


@pytest.mark.parametrize("error", [ErrorClass.LOCAL_INVALID, ErrorClass.PROVIDER_REJECTED])
def test_non_retryable_errors_give_up_at_once(error: ErrorClass) -> None:
    d = decide_retry(ctx(error), DEFAULT_BUDGETS[Step.SUBMIT], T0, random.Random(1))
    assert d.verdict is Verdict.GIVE_UP


def test_expired_url_refreshes_first_then_retries() -> None:
    budget = DEFAULT_BUDGETS[Step.OUTPUT_FETCH]
    first = decide_retry(ctx(ErrorClass.OUTPUT_URL_EXPIRED), budget, T0, random.Random(1))
    assert first.verdict is Verdict.REFRESH_URL
    second = decide_retry(ctx(ErrorClass.OUTPUT_URL_EXPIRED, 2, url_refreshed=True), budget, T0, random.Random(1))
    assert second.verdict is Verdict.RETRY


def test_retry_after_is_honoured() -> None:
    d = decide_retry(
        ctx(ErrorClass.PROVIDER_RATE_LIMITED, retry_after_s=120), DEFAULT_BUDGETS[Step.SUBMIT], T0, random.Random(3)
    )
    assert d.verdict is Verdict.RETRY and d.retry_at is not None
    assert d.retry_at - T0 >= timedelta(seconds=120)


def test_attempt_budget_is_per_step() -> None:
    submit, query = DEFAULT_BUDGETS[Step.SUBMIT], DEFAULT_BUDGETS[Step.QUERY]
    spent = decide_retry(ctx(ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, 3), submit, T0, random.Random(1))
    assert spent.verdict is Verdict.GIVE_UP and "3/3" in spent.reason
    # three failed queries are nowhere near the query budget
    assert decide_retry(ctx(ErrorClass.QUERY_FAILED, 3), query, T0, random.Random(1)).verdict is Verdict.RETRY


def test_media_budget_spent_goes_to_a_human() -> None:
    d = decide_retry(ctx(ErrorClass.MEDIA_WORKER_CRASHED, 3), DEFAULT_BUDGETS[Step.MEDIA], T0, random.Random(1))
    assert d.verdict is Verdict.MANUAL


def test_total_wait_step_deadline_and_task_deadline() -> None:
    budget = DEFAULT_BUDGETS[Step.QUERY]  # 1800 s total wait, 3600 s step deadline
    late = T0 + timedelta(seconds=1801)
    assert decide_retry(ctx(ErrorClass.QUERY_FAILED, 2), budget, late, random.Random(1)).verdict is Verdict.GIVE_UP
    c = FailureContext(ErrorClass.QUERY_FAILED, 2, first_failure_at=T0 + timedelta(seconds=3500), step_started_at=T0)
    assert decide_retry(c, budget, T0 + timedelta(seconds=3601), random.Random(1)).verdict is Verdict.GIVE_UP
    near = ctx(ErrorClass.QUERY_FAILED, 1, task_deadline_at=T0 + timedelta(seconds=1))
    assert decide_retry(near, budget, T0 + timedelta(seconds=1), random.Random(1)).verdict is Verdict.GIVE_UP


def test_business_schedule_defaults_are_30s_2min_5min() -> None:
    submit = DEFAULT_BUDGETS[Step.SUBMIT]
    assert [submit.delay_cap(n) for n in range(4)] == [30, 120, 300, 300]
    assert submit.max_attempts == 3


@given(
    attempts=st.integers(1, 60),
    seed=st.integers(0, 2**32),
    base=st.floats(0.1, 100),
    mult=st.floats(1, 10),
    cap=st.floats(100, 10_000),
)
def test_full_jitter_stays_within_zero_and_the_capped_exponential(
    attempts: int, seed: int, base: float, mult: float, cap: float
) -> None:
    budget = RetryBudget(
        max_attempts=100,
        max_total_wait_s=1e9,
        deadline_s=1e9,
        base_delay_s=base,
        multiplier=mult,
        max_delay_s=cap,
        provider_switch_allowed=False,
        manual_confirmation_required=False,
    )
    d = decide_retry(ctx(ErrorClass.CONNECT_FAILED, attempts), budget, T0, random.Random(seed))
    assert d.verdict is Verdict.RETRY and d.retry_at is not None
    delay = (d.retry_at - T0).total_seconds()
    assert 0 <= delay <= min(cap, base * mult ** (attempts - 1)) + 1e-6


def test_same_seed_same_schedule() -> None:
    budget = DEFAULT_BUDGETS[Step.OUTPUT_FETCH]
    a = [
        decide_retry(ctx(ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT, n), budget, T0, random.Random(9)).retry_at
        for n in (1, 2)
    ]
    b = [
        decide_retry(ctx(ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT, n), budget, T0, random.Random(9)).retry_at
        for n in (1, 2)
    ]
    assert a == b
