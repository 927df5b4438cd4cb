"""Failure policy, pure: error classes, the retry matrix and per-step budgets.

One retry counter is not enough: twenty failed queries say nothing about whether a submit may be repeated,
so every step owns its budget. Time and randomness come in as arguments, so schedules are testable.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class Step(StrEnum):
    SUBMIT = "submit"
    QUERY = "query"
    OUTPUT_FETCH = "output_fetch"
    MEDIA = "media"
    NOTIFICATION = "notification"


class ErrorClass(StrEnum):
    """The classes of failure the retry matrix has a row for, one member per row."""

    LOCAL_INVALID = "local_invalid"  # serialization failed, required field missing
    PROVIDER_REJECTED = "provider_rejected"  # explicit 4xx: unsupported resolution, moderation refusal
    PROVIDER_RATE_LIMITED = "provider_rate_limited"  # 429 / THROTTLED
    PROVIDER_5XX_NOT_ACCEPTED = "provider_5xx_not_accepted"  # explicit error response, job not created
    CONNECT_FAILED = "connect_failed"  # DNS, connection refused, connect timeout
    SUBMIT_AMBIGUOUS = "submit_ambiguous"  # read timeout / disconnect after the request was written
    QUERY_FAILED = "query_failed"  # polling timeout or error
    CALLBACK_PROCESSING_FAILED = "callback_processing_failed"  # e.g. database briefly unavailable
    OUTPUT_DOWNLOAD_TRANSIENT = "output_download_transient"  # 5xx or broken stream while downloading
    OUTPUT_URL_EXPIRED = "output_url_expired"  # 403 / 404 on the output URL
    MEDIA_WORKER_CRASHED = "media_worker_crashed"  # process exit, node failure


class ErrorOutcome(StrEnum):
    """Why a task or attempt failed when the cause is not one of the matrix's rows (nothing retries on these)."""

    PROVIDER_FAILED = "provider_failed"  # the provider reported the accepted job failed / aborted
    MEDIA_REJECTED = "media_rejected"  # the output failed the media gate (or media gave up)
    REVIEW_REJECTED = "review_rejected"  # a reviewer rejected the output
    REVIEW_SLA_PASSED = "review_sla_passed"  # no verdict within the review SLA: rejected by the engine
    CONFIRMED_NOT_CREATED = "confirmed_not_created"  # reconciliation proved an ambiguous submit created nothing
    SENDER_LOST = "sender_lost"  # a SENDING attempt whose sender vanished: treated as ambiguous
    NOT_SENT_TASK_MOVED = "not_sent_task_moved"  # the task moved (canceled, expired) before the send


#: what `last_error_class` (tasks and attempts) is written from: never a free string
LastError = ErrorClass | ErrorOutcome


def last_error_value(error: LastError) -> str:
    if not isinstance(error, (ErrorClass, ErrorOutcome)):
        raise TypeError(f"last_error_class must be an ErrorClass or ErrorOutcome, not {error!r}")
    return error.value


class AutoRetry(StrEnum):
    NO = "no"
    USUALLY_NO = "usually_no"
    YES_DELAYED = "yes_delayed"  # honour Retry-After
    YES = "yes"
    NOT_IMMEDIATELY = "not_immediately"  # reconcile first
    BY_REDELIVERY = "by_redelivery"  # the sender or the broker retries
    CONDITIONAL = "conditional"  # only after refreshing the URL


class DuplicateRisk(StrEnum):
    NONE = "none"
    LOW = "low"
    HIGH = "high"
    EXTRA_TRAFFIC = "extra_traffic"
    EXTRA_COMPUTE = "extra_compute"


class Strategy(StrEnum):
    FAIL_FINAL = "fail_final"  # fix the code or return a final failure
    FAIL_BUSINESS = "fail_business"  # normalise into a business failure; never resubmit a moderation refusal
    BACKOFF_HONOUR_RETRY_AFTER = "backoff_honour_retry_after"  # and shrink the provider's slots
    BACKOFF = "backoff"  # exponential, within the budget
    SHORT_BACKOFF = "short_backoff"  # record the phase, retry soon
    RECONCILE = "reconcile"  # SUBMIT_UNKNOWN + lookup by request key
    BACKOFF_NO_STATE_CHANGE = "backoff_no_state_change"
    PERSIST_AND_DEDUPE = "persist_and_dedupe"  # raw event stored, redelivery is safe
    REDOWNLOAD = "redownload"  # range / full re-download, verify checksum
    REFRESH_URL_FIRST = "refresh_url_first"  # query the provider for a fresh URL
    RERUN_MEDIA = "rerun_media"  # deterministic derivative keys + resource lease


@dataclass(frozen=True, slots=True)
class MatrixRow:
    step: Step
    auto_retry: AutoRetry
    duplicate_risk: DuplicateRisk
    strategy: Strategy

    @property
    def retryable(self) -> bool:
        """May the step be tried again without a human or a reconciliation first?"""
        return self.auto_retry in (AutoRetry.YES, AutoRetry.YES_DELAYED, AutoRetry.BY_REDELIVERY, AutoRetry.CONDITIONAL)


RETRY_MATRIX: dict[ErrorClass, MatrixRow] = {
    ErrorClass.LOCAL_INVALID: MatrixRow(Step.SUBMIT, AutoRetry.NO, DuplicateRisk.NONE, Strategy.FAIL_FINAL),
    ErrorClass.PROVIDER_REJECTED: MatrixRow(
        Step.SUBMIT, AutoRetry.USUALLY_NO, DuplicateRisk.NONE, Strategy.FAIL_BUSINESS
    ),
    ErrorClass.PROVIDER_RATE_LIMITED: MatrixRow(
        Step.SUBMIT, AutoRetry.YES_DELAYED, DuplicateRisk.LOW, Strategy.BACKOFF_HONOUR_RETRY_AFTER
    ),
    ErrorClass.PROVIDER_5XX_NOT_ACCEPTED: MatrixRow(Step.SUBMIT, AutoRetry.YES, DuplicateRisk.LOW, Strategy.BACKOFF),
    ErrorClass.CONNECT_FAILED: MatrixRow(Step.SUBMIT, AutoRetry.YES, DuplicateRisk.LOW, Strategy.SHORT_BACKOFF),
    ErrorClass.SUBMIT_AMBIGUOUS: MatrixRow(
        Step.SUBMIT, AutoRetry.NOT_IMMEDIATELY, DuplicateRisk.HIGH, Strategy.RECONCILE
    ),
    ErrorClass.QUERY_FAILED: MatrixRow(Step.QUERY, AutoRetry.YES, DuplicateRisk.NONE, Strategy.BACKOFF_NO_STATE_CHANGE),
    ErrorClass.CALLBACK_PROCESSING_FAILED: MatrixRow(
        Step.NOTIFICATION, AutoRetry.BY_REDELIVERY, DuplicateRisk.NONE, Strategy.PERSIST_AND_DEDUPE
    ),
    ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT: MatrixRow(
        Step.OUTPUT_FETCH, AutoRetry.YES, DuplicateRisk.EXTRA_TRAFFIC, Strategy.REDOWNLOAD
    ),
    ErrorClass.OUTPUT_URL_EXPIRED: MatrixRow(
        Step.OUTPUT_FETCH, AutoRetry.CONDITIONAL, DuplicateRisk.NONE, Strategy.REFRESH_URL_FIRST
    ),
    ErrorClass.MEDIA_WORKER_CRASHED: MatrixRow(
        Step.MEDIA, AutoRetry.YES, DuplicateRisk.EXTRA_COMPUTE, Strategy.RERUN_MEDIA
    ),
}


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """How much one step may retry. Delay n (0-based) is uniform(0, min(max_delay, base × multiplier**n))."""

    max_attempts: int
    max_total_wait_s: float
    deadline_s: float
    base_delay_s: float
    multiplier: float
    max_delay_s: float
    provider_switch_allowed: bool
    manual_confirmation_required: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def delay_cap(self, retry_index: int) -> float:
        """Upper bound of the delay before retry number `retry_index` (0-based), before jitter."""
        # cap the exponent first so huge indexes cannot overflow a float
        exponent = min(retry_index, 64)
        return min(self.max_delay_s, self.base_delay_s * self.multiplier**exponent)


# business retries 30 s, 2 min, 5 min, max_retry 3 per step; polling ≥ 5 s (Runway).
DEFAULT_BUDGETS: dict[Step, RetryBudget] = {
    Step.SUBMIT: RetryBudget(
        max_attempts=3,
        max_total_wait_s=900,
        deadline_s=1800,
        base_delay_s=30,
        multiplier=4,
        max_delay_s=300,
        provider_switch_allowed=True,
        manual_confirmation_required=False,
    ),
    Step.QUERY: RetryBudget(
        max_attempts=20,
        max_total_wait_s=1800,
        deadline_s=3600,
        base_delay_s=5,
        multiplier=2,
        max_delay_s=60,
        provider_switch_allowed=False,
        manual_confirmation_required=False,
    ),
    Step.OUTPUT_FETCH: RetryBudget(
        max_attempts=5,
        max_total_wait_s=900,
        deadline_s=3600,
        base_delay_s=10,
        multiplier=3,
        max_delay_s=300,
        provider_switch_allowed=False,
        manual_confirmation_required=False,
    ),
    Step.MEDIA: RetryBudget(
        max_attempts=3,
        max_total_wait_s=900,
        deadline_s=3600,
        base_delay_s=30,
        multiplier=4,
        max_delay_s=300,
        provider_switch_allowed=False,
        manual_confirmation_required=True,
    ),
    # client webhooks (services/webhooks.py): a receiver that is down for a deploy or an outage must still get
    # its events, so attempts spread over hours (5 s, 20 s, 80 s, ... capped at 3 h; ~5 h in all), then DEAD
    Step.NOTIFICATION: RetryBudget(
        max_attempts=8,
        max_total_wait_s=86_400,
        deadline_s=90_000,
        base_delay_s=5,
        multiplier=4,
        max_delay_s=10_800,
        provider_switch_allowed=False,
        manual_confirmation_required=False,
    ),
}


class Verdict(StrEnum):
    RETRY = "retry"
    RECONCILE = "reconcile"  # ambiguous submit: look the job up, never resubmit blindly
    REFRESH_URL = "refresh_url"  # ask the provider for a fresh output URL, then retry
    GIVE_UP = "give_up"  # final failure for this step
    MANUAL = "manual"  # budget spent on a step that needs a human to confirm


@dataclass(frozen=True, slots=True)
class RetryDecision:
    verdict: Verdict
    retry_at: datetime | None
    reason: str


@dataclass(frozen=True, slots=True)
class FailureContext:
    """What is known about a step's failures so far."""

    error_class: ErrorClass
    attempts_made: int  # including the one that just failed
    first_failure_at: datetime
    step_started_at: datetime
    task_deadline_at: datetime | None = None
    retry_after_s: float | None = None  # from a 429 / THROTTLED answer
    url_refreshed: bool = False  # OUTPUT_URL_EXPIRED: has a fresh URL been asked for already?


def decide_retry(ctx: FailureContext, budget: RetryBudget, now: datetime, rng: random.Random) -> RetryDecision:
    """Apply the matrix and the step's budget. Pure: `now` and `rng` come from the caller."""
    row = RETRY_MATRIX[ctx.error_class]
    if row.strategy is Strategy.RECONCILE:
        return RetryDecision(Verdict.RECONCILE, None, "ambiguous submit: reconcile by request key before any resubmit")
    if row.auto_retry in (AutoRetry.NO, AutoRetry.USUALLY_NO):
        return RetryDecision(Verdict.GIVE_UP, None, f"{ctx.error_class} is not retried automatically")
    if row.strategy is Strategy.REFRESH_URL_FIRST and not ctx.url_refreshed:
        return RetryDecision(Verdict.REFRESH_URL, now, "output URL rejected: query the provider for a fresh URL first")

    exhausted = _exhausted(ctx, budget, now)
    if exhausted:
        verdict = Verdict.MANUAL if budget.manual_confirmation_required else Verdict.GIVE_UP
        return RetryDecision(verdict, None, exhausted)

    delay = rng.uniform(0, budget.delay_cap(ctx.attempts_made - 1))  # full jitter
    if ctx.retry_after_s is not None:
        delay = max(delay, ctx.retry_after_s)
    retry_at = now + timedelta(seconds=delay)
    late = _past_limits(ctx, budget, retry_at)
    if late:
        verdict = Verdict.MANUAL if budget.manual_confirmation_required else Verdict.GIVE_UP
        return RetryDecision(verdict, None, late)
    return RetryDecision(
        Verdict.RETRY, retry_at, f"retry {ctx.attempts_made + 1}/{budget.max_attempts} in {delay:.1f}s"
    )


def _exhausted(ctx: FailureContext, budget: RetryBudget, now: datetime) -> str | None:
    if ctx.attempts_made >= budget.max_attempts:
        return f"retry budget spent: {ctx.attempts_made}/{budget.max_attempts} attempts"
    return _past_limits(ctx, budget, now)


def _past_limits(ctx: FailureContext, budget: RetryBudget, at: datetime) -> str | None:
    if (at - ctx.first_failure_at).total_seconds() > budget.max_total_wait_s:
        return f"retry budget spent: waited more than {budget.max_total_wait_s:g}s since the first failure"
    if (at - ctx.step_started_at).total_seconds() > budget.deadline_s:
        return f"step deadline of {budget.deadline_s:g}s passed"
    if ctx.task_deadline_at is not None and at >= ctx.task_deadline_at:
        return "task deadline passed"
    return None
