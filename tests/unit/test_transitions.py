"""The task and attempt machines, pair by pair, against the seed's table written out independently here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aivedio_engine.domain.settlement import CLOSING_EFFECTS
from aivedio_engine.domain.status import TASK_TERMINAL, AttemptStatus, CancelOutcome, TaskStatus
from aivedio_engine.domain.transitions import (
    ATTEMPT_MACHINE,
    TASK_MACHINE,
    AttemptDecision,
    AttemptEvent,
    Decision,
    Effect,
    Rejection,
    RejectionKind,
    TaskEvent,
    TaskSnapshot,
    Trigger,
    decide,
    decide_attempt,
)

NOW = datetime(2026, 6, 23, 3, 0, tzinfo=UTC)
NON_TERMINAL = [s for s in TaskStatus if s not in TASK_TERMINAL]


def _expected_task_edges() -> dict[tuple[str, str], str]:
    """, spelled with plain strings so a typo in the enum cannot hide here."""
    edges = {
        ("CREATED", "validation_started"): "VALIDATING",
        ("VALIDATING", "validation_passed"): "QUOTA_RESERVED",
        ("QUOTA_RESERVED", "queued"): "QUEUED",
        ("QUEUED", "dispatch_claimed"): "DISPATCHING",
        ("DISPATCHING", "provider_accepted"): "SUBMITTED",
        ("DISPATCHING", "submit_ambiguous"): "SUBMIT_UNKNOWN",
        ("SUBMIT_UNKNOWN", "provider_job_found"): "SUBMITTED",
        ("SUBMIT_UNKNOWN", "confirmed_not_created"): "RETRY_WAIT",
        ("SUBMITTED", "provider_running"): "RUNNING",
        ("SUBMITTED", "provider_succeeded"): "OUTPUT_FETCHING",
        ("RUNNING", "provider_succeeded"): "OUTPUT_FETCHING",
        ("OUTPUT_FETCHING", "output_persisted"): "POST_PROCESSING",
        ("POST_PROCESSING", "playable_asset_ready"): "SUCCEEDED",
        ("RETRY_WAIT", "retry_due"): "QUEUED",
        ("CANCEL_REQUESTED", "cancel_confirmed"): "CANCELED",
        ("CANCEL_REQUESTED", "completion_won"): "OUTPUT_FETCHING",
        ("POST_PROCESSING", "review_required"): "MANUAL_REVIEW",
        # a fetch past its budget with `manual_confirmation_required` holds the vendor's output for a person
        ("OUTPUT_FETCHING", "review_required"): "MANUAL_REVIEW",
        ("MANUAL_REVIEW", "review_approved"): "SUCCEEDED",
        ("MANUAL_REVIEW", "review_rejected"): "FAILED_FINAL",
        ("SUBMIT_UNKNOWN", "cancel_requested"): "CANCEL_REQUESTED",
    }
    for s in ("QUOTA_RESERVED", "QUEUED", "DISPATCHING", "SUBMITTED", "RUNNING"):
        edges[(s, "retryable_failure")] = "RETRY_WAIT"
    for s in ("CREATED", "VALIDATING", "QUOTA_RESERVED", "QUEUED", "RETRY_WAIT"):
        edges[(s, "cancel_requested")] = "CANCELED"
    for s in ("DISPATCHING", "SUBMITTED", "RUNNING"):
        edges[(s, "cancel_requested")] = "CANCEL_REQUESTED"
    for s in NON_TERMINAL:
        edges[(s.value, "final_failure")] = "FAILED_FINAL"
        # the deadline governs until the vendor produced the output; a held output waits on its own budgets
        if s.value not in ("OUTPUT_FETCHING", "POST_PROCESSING", "MANUAL_REVIEW"):
            edges[(s.value, "deadline_passed")] = "EXPIRED"
    return edges


EXPECTED = _expected_task_edges()


def test_table_matches_the_seed_exactly() -> None:
    got = {(e.source.value, e.event.value): e.target.value for e in TASK_MACHINE.edges()}
    assert got == EXPECTED


@pytest.mark.parametrize("state", list(TaskStatus))
@pytest.mark.parametrize("event", list(TaskEvent))
def test_every_state_event_pair(state: TaskStatus, event: TaskEvent) -> None:
    task = TaskSnapshot(status=state, version=7, progress=40, deadline_at=NOW - timedelta(seconds=1))
    result = decide(task, event, NOW)
    expected = EXPECTED.get((state.value, event.value))
    if expected is not None:
        assert isinstance(result, Decision), result
        assert result.to_status.value == expected
        assert result.version == 8
        assert result.from_status is state
        assert Effect.NOTIFY in result.effects
        assert result.progress >= 40
    else:
        assert isinstance(result, Rejection)
        if state in TASK_TERMINAL:
            assert result.kind is RejectionKind.TERMINAL
        else:
            assert result.kind in (RejectionKind.ILLEGAL, RejectionKind.STALE, RejectionKind.DUPLICATE)


def test_terminal_states_have_no_exits() -> None:
    for state in TASK_TERMINAL:
        assert TASK_MACHINE.targets(state) == set()


def test_every_state_reachable_and_every_non_terminal_can_end() -> None:
    assert TASK_MACHINE.reachable_from(TaskStatus.CREATED) == set(TaskStatus)
    for state in NON_TERMINAL:
        assert TASK_MACHINE.reachable_from(state) & TASK_TERMINAL


def test_stale_version_is_rejected() -> None:
    task = TaskSnapshot(TaskStatus.SUBMITTED, version=5)
    result = decide(task, Trigger(TaskEvent.PROVIDER_RUNNING, expected_version=4), NOW)
    assert isinstance(result, Rejection) and result.kind is RejectionKind.STALE
    ok = decide(task, Trigger(TaskEvent.PROVIDER_RUNNING, expected_version=5), NOW)
    assert isinstance(ok, Decision) and ok.version == 6


def test_late_running_after_output_fetching_is_stale_and_duplicate_running_is_duplicate() -> None:
    late = decide(TaskSnapshot(TaskStatus.OUTPUT_FETCHING, 9), TaskEvent.PROVIDER_RUNNING, NOW)
    assert isinstance(late, Rejection) and late.kind is RejectionKind.STALE
    dup = decide(TaskSnapshot(TaskStatus.RUNNING, 9), TaskEvent.PROVIDER_RUNNING, NOW)
    assert isinstance(dup, Rejection) and dup.kind is RejectionKind.DUPLICATE
    illegal = decide(TaskSnapshot(TaskStatus.CREATED), TaskEvent.PROVIDER_SUCCEEDED, NOW)
    assert isinstance(illegal, Rejection) and illegal.kind is RejectionKind.ILLEGAL


def test_late_success_after_cancel_is_an_anomaly_not_a_transition() -> None:
    result = decide(TaskSnapshot(TaskStatus.CANCELED, 12), TaskEvent.PROVIDER_SUCCEEDED, NOW)
    assert isinstance(result, Rejection)
    assert result.kind is RejectionKind.TERMINAL and result.anomaly
    late_running = decide(TaskSnapshot(TaskStatus.SUCCEEDED, 12), TaskEvent.PROVIDER_RUNNING, NOW)
    assert isinstance(late_running, Rejection) and not late_running.anomaly
    late_failure = decide(TaskSnapshot(TaskStatus.SUCCEEDED, 12), TaskEvent.FINAL_FAILURE, NOW)
    assert isinstance(late_failure, Rejection) and late_failure.anomaly


def test_deadline_passed_needs_the_deadline_to_have_passed() -> None:
    task = TaskSnapshot(TaskStatus.QUEUED, 3, deadline_at=NOW + timedelta(seconds=5))
    early = decide(task, TaskEvent.DEADLINE_PASSED, NOW)
    assert isinstance(early, Rejection) and early.kind is RejectionKind.ILLEGAL
    on_time = decide(task, TaskEvent.DEADLINE_PASSED, NOW + timedelta(seconds=5))
    assert isinstance(on_time, Decision) and on_time.to_status is TaskStatus.EXPIRED
    assert Effect.RELEASE_CREDITS in on_time.effects
    no_deadline = decide(TaskSnapshot(TaskStatus.QUEUED, 3), TaskEvent.DEADLINE_PASSED, NOW)
    assert isinstance(no_deadline, Rejection)


@pytest.mark.parametrize(
    ("state", "event", "credit_effect"),
    [
        (TaskStatus.QUEUED, TaskEvent.CANCEL_REQUESTED, Effect.RELEASE_CREDITS),
        (TaskStatus.CREATED, TaskEvent.CANCEL_REQUESTED, None),
        (TaskStatus.RETRY_WAIT, TaskEvent.CANCEL_REQUESTED, Effect.SETTLE_PER_BILLING_RULE),
        # nothing delivered, not the tenant's doing: released, the vendor's bill is platform cost
        (TaskStatus.RUNNING, TaskEvent.FINAL_FAILURE, Effect.ABSORB_PROVIDER_COST),
        (TaskStatus.POST_PROCESSING, TaskEvent.FINAL_FAILURE, Effect.ABSORB_PROVIDER_COST),
        (TaskStatus.OUTPUT_FETCHING, TaskEvent.FINAL_FAILURE, Effect.ABSORB_PROVIDER_COST),
        (TaskStatus.MANUAL_REVIEW, TaskEvent.FINAL_FAILURE, Effect.ABSORB_PROVIDER_COST),
        # the tenant's or a person's decision: per the vendor's bill
        (TaskStatus.MANUAL_REVIEW, TaskEvent.REVIEW_REJECTED, Effect.SETTLE_CREDITS),
        (TaskStatus.CANCEL_REQUESTED, TaskEvent.FINAL_FAILURE, Effect.SETTLE_PER_BILLING_RULE),
        (TaskStatus.RUNNING, TaskEvent.DEADLINE_PASSED, Effect.SETTLE_PER_BILLING_RULE),
        (TaskStatus.POST_PROCESSING, TaskEvent.PLAYABLE_ASSET_READY, Effect.SETTLE_CREDITS),
        (TaskStatus.CANCEL_REQUESTED, TaskEvent.CANCEL_CONFIRMED, Effect.SETTLE_PER_BILLING_RULE),
    ],
)
def test_closing_transitions_close_the_reservation(
    state: TaskStatus, event: TaskEvent, credit_effect: Effect | None
) -> None:
    result = decide(TaskSnapshot(state, 1, deadline_at=NOW), event, NOW)
    assert isinstance(result, Decision)
    money = set(CLOSING_EFFECTS) & set(result.effects)
    assert money == ({credit_effect} if credit_effect else set())


def test_cancel_with_a_provider_job_asks_the_provider() -> None:
    running = decide(TaskSnapshot(TaskStatus.RUNNING, 4), TaskEvent.CANCEL_REQUESTED, NOW)
    assert isinstance(running, Decision) and Effect.REQUEST_PROVIDER_CANCEL in running.effects
    unknown = decide(TaskSnapshot(TaskStatus.SUBMIT_UNKNOWN, 4), TaskEvent.CANCEL_REQUESTED, NOW)
    assert isinstance(unknown, Decision) and unknown.to_status is TaskStatus.CANCEL_REQUESTED
    assert Effect.SCHEDULE_RECONCILE in unknown.effects  # no job id yet: find it before canceling


def test_completion_wins_over_cancel_with_too_late_outcome() -> None:
    result = decide(TaskSnapshot(TaskStatus.CANCEL_REQUESTED, 6), TaskEvent.COMPLETION_WON, NOW)
    assert isinstance(result, Decision)
    assert result.to_status is TaskStatus.OUTPUT_FETCHING
    assert result.cancel_outcome is CancelOutcome.TOO_LATE
    assert Effect.REQUEST_OUTPUT_FETCH in result.effects


def test_submit_unknown_never_retries_without_confirmation() -> None:
    for event in (TaskEvent.RETRYABLE_FAILURE, TaskEvent.RETRY_DUE, TaskEvent.DISPATCH_CLAIMED):
        assert isinstance(decide(TaskSnapshot(TaskStatus.SUBMIT_UNKNOWN, 2), event, NOW), Rejection)


def test_progress_is_display_only_and_never_decreases() -> None:
    task = TaskSnapshot(TaskStatus.SUBMITTED, 3, progress=60)
    result = decide(task, Trigger(TaskEvent.PROVIDER_RUNNING, progress=20), NOW)
    assert isinstance(result, Decision) and result.progress == 60
    result = decide(task, Trigger(TaskEvent.PROVIDER_RUNNING, progress=250), NOW)
    assert isinstance(result, Decision) and result.progress == 100


# ---------------------------------------------------------------------------------------------- attempts

EXPECTED_ATTEMPT = {
    ("NEW", "send_started"): "SENDING",
    ("SENDING", "provider_accepted"): "ACKED",
    ("SENDING", "submit_ambiguous"): "UNKNOWN",
    ("NEW", "rejected_before_accept"): "FAILED_BEFORE_ACCEPT",
    ("SENDING", "rejected_before_accept"): "FAILED_BEFORE_ACCEPT",
    ("UNKNOWN", "provider_job_found"): "ACKED",
    ("UNKNOWN", "confirmed_not_created"): "FAILED_BEFORE_ACCEPT",
    ("ACKED", "provider_running"): "RUNNING",
    ("ACKED", "provider_succeeded"): "SUCCEEDED",
    ("RUNNING", "provider_succeeded"): "SUCCEEDED",
    ("ACKED", "provider_failed"): "FAILED",
    ("RUNNING", "provider_failed"): "FAILED",
    ("ACKED", "cancel_confirmed"): "CANCELED",
    ("RUNNING", "cancel_confirmed"): "CANCELED",
    ("ACKED", "task_ended"): "CANCELED",
    ("RUNNING", "task_ended"): "CANCELED",
}


@pytest.mark.parametrize("state", list(AttemptStatus))
@pytest.mark.parametrize("event", list(AttemptEvent))
def test_every_attempt_pair(state: AttemptStatus, event: AttemptEvent) -> None:
    result = decide_attempt(state, event)
    expected = EXPECTED_ATTEMPT.get((state.value, event.value))
    if expected is None:
        assert isinstance(result, Rejection)
        if state.is_terminal:
            assert result.kind is RejectionKind.TERMINAL
    else:
        assert isinstance(result, AttemptDecision) and result.to_status.value == expected


def test_attempt_table_is_exact() -> None:
    got = {(e.source.value, e.event.value): e.target.value for e in ATTEMPT_MACHINE.edges()}
    assert got == EXPECTED_ATTEMPT


def test_an_unknown_attempt_can_never_fail_before_accept_without_reconciliation() -> None:
    """A read timeout is not 'not accepted': UNKNOWN leaves only through reconciliation's verdicts."""
    assert {e.event for e in ATTEMPT_MACHINE.edges() if e.source is AttemptStatus.UNKNOWN} == {
        AttemptEvent.PROVIDER_JOB_FOUND,
        AttemptEvent.CONFIRMED_NOT_CREATED,
    }
