"""The task and attempt transition tables and `decide()`.

`decide(task, trigger, now)` is the only way a task changes state: it returns a `Decision` (new status, new
version, display progress, the effects the caller must record in the same transaction) or a `Rejection`
saying why nothing may change (illegal / stale / duplicate / terminal, flagged as an anomaly when a late
event contradicts a terminal state). It does no I/O.

Where the seed says "any non-terminal state" for `retryable_failure`, this table narrows it; each exclusion
protects money or a human decision:
- SUBMIT_UNKNOWN: only `confirmed_not_created` may lead to a retry.
- CANCEL_REQUESTED: a retry would drop the user's cancel intent.
- OUTPUT_FETCHING, POST_PROCESSING, MANUAL_REVIEW: the provider already produced the video; those steps retry
  themselves within their own budgets — `retry_due → QUEUED` would pay
  for a second generation.
- CREATED, VALIDATING: nothing is reserved yet, and `retry_due → QUEUED` would skip the reservation.
- RETRY_WAIT: already waiting; a second failure report is a duplicate.
Cancel before dispatch includes QUEUED (no provider cost yet) and RETRY_WAIT (no attempt in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from aivedio_engine.domain.machine import Edge, Machine, Rule
from aivedio_engine.domain.status import (
    ATTEMPT_TERMINAL,
    TASK_TERMINAL,
    AttemptStatus,
    CancelOutcome,
    TaskStatus,
)

T = TaskStatus


class TaskEvent(StrEnum):
    VALIDATION_STARTED = "validation_started"
    VALIDATION_PASSED = "validation_passed"
    QUEUED = "queued"
    DISPATCH_CLAIMED = "dispatch_claimed"
    PROVIDER_ACCEPTED = "provider_accepted"
    SUBMIT_AMBIGUOUS = "submit_ambiguous"
    PROVIDER_JOB_FOUND = "provider_job_found"
    CONFIRMED_NOT_CREATED = "confirmed_not_created"
    PROVIDER_RUNNING = "provider_running"
    PROVIDER_SUCCEEDED = "provider_succeeded"
    OUTPUT_PERSISTED = "output_persisted"
    PLAYABLE_ASSET_READY = "playable_asset_ready"
    RETRYABLE_FAILURE = "retryable_failure"
    RETRY_DUE = "retry_due"
    CANCEL_REQUESTED = "cancel_requested"
    CANCEL_CONFIRMED = "cancel_confirmed"
    COMPLETION_WON = "completion_won"
    FINAL_FAILURE = "final_failure"
    REVIEW_REQUIRED = "review_required"
    REVIEW_APPROVED = "review_approved"
    REVIEW_REJECTED = "review_rejected"
    DEADLINE_PASSED = "deadline_passed"


E = TaskEvent

NON_TERMINAL: tuple[TaskStatus, ...] = tuple(s for s in TaskStatus if s not in TASK_TERMINAL)
BEFORE_DISPATCH = (T.CREATED, T.VALIDATING, T.QUOTA_RESERVED, T.QUEUED, T.RETRY_WAIT)
WITH_PROVIDER_JOB = (T.DISPATCHING, T.SUBMITTED, T.RUNNING, T.SUBMIT_UNKNOWN)
RETRYABLE_FROM = (T.QUOTA_RESERVED, T.QUEUED, T.DISPATCHING, T.SUBMITTED, T.RUNNING)
#: the vendor has produced the output: from here fetch, media and review run on their own budgets and the review
#: SLA, never on the task's deadline, so a held output is not expired (and charged) for waiting on our side
HOLDING_OUTPUT = (T.OUTPUT_FETCHING, T.POST_PROCESSING, T.MANUAL_REVIEW)
DEADLINE_GOVERNS = tuple(s for s in NON_TERMINAL if s not in HOLDING_OUTPUT)

TASK_MACHINE: Machine[TaskStatus, TaskEvent] = Machine(
    "task",
    TaskStatus,
    TaskEvent,
    initial=T.CREATED,
    terminal=TASK_TERMINAL,
    rules=[
        Rule((T.CREATED,), E.VALIDATION_STARTED, T.VALIDATING, "append state event"),
        Rule((T.VALIDATING,), E.VALIDATION_PASSED, T.QUOTA_RESERVED, "credit reservation booked"),
        Rule((T.QUOTA_RESERVED,), E.QUEUED, T.QUEUED, "outbox row in the same transaction"),
        Rule((T.QUEUED,), E.DISPATCH_CLAIMED, T.DISPATCHING, "not canceled, version matches, attempt created"),
        Rule((T.DISPATCHING,), E.PROVIDER_ACCEPTED, T.SUBMITTED, "unique provider_job_id saved"),
        Rule((T.DISPATCHING,), E.SUBMIT_AMBIGUOUS, T.SUBMIT_UNKNOWN, "reconcile; no new attempt yet"),
        Rule((T.SUBMIT_UNKNOWN,), E.PROVIDER_JOB_FOUND, T.SUBMITTED, "bind the job id found by reconciliation"),
        Rule((T.SUBMIT_UNKNOWN,), E.CONFIRMED_NOT_CREATED, T.RETRY_WAIT, "retry only once not-created is confirmed"),
        Rule((T.SUBMITTED,), E.PROVIDER_RUNNING, T.RUNNING, "may be skipped: success can come first"),
        Rule((T.SUBMITTED, T.RUNNING), E.PROVIDER_SUCCEEDED, T.OUTPUT_FETCHING, "publish the fetch request"),
        Rule((T.OUTPUT_FETCHING,), E.OUTPUT_PERSISTED, T.POST_PROCESSING, "raw output in our object store"),
        Rule((T.POST_PROCESSING,), E.PLAYABLE_ASSET_READY, T.SUCCEEDED, "settle credits, notify"),
        Rule(RETRYABLE_FROM, E.RETRYABLE_FAILURE, T.RETRY_WAIT, "next_retry_at, error class, step budget"),
        Rule((T.RETRY_WAIT,), E.RETRY_DUE, T.QUEUED, "re-check cancel and deadline before the next attempt"),
        Rule(BEFORE_DISPATCH, E.CANCEL_REQUESTED, T.CANCELED, "no provider job in flight: release the reservation"),
        Rule(WITH_PROVIDER_JOB, E.CANCEL_REQUESTED, T.CANCEL_REQUESTED, "cancel the provider job asynchronously"),
        Rule((T.CANCEL_REQUESTED,), E.CANCEL_CONFIRMED, T.CANCELED, "settle or refund per the provider's billing"),
        Rule((T.CANCEL_REQUESTED,), E.COMPLETION_WON, T.OUTPUT_FETCHING, "cancel_outcome=TOO_LATE; completion wins"),
        Rule(NON_TERMINAL, E.FINAL_FAILURE, T.FAILED_FINAL, "settle or release, notify"),
        Rule((T.OUTPUT_FETCHING, T.POST_PROCESSING), E.REVIEW_REQUIRED, T.MANUAL_REVIEW, "output held for a human"),
        Rule((T.MANUAL_REVIEW,), E.REVIEW_APPROVED, T.SUCCEEDED, "settle credits, notify"),
        Rule((T.MANUAL_REVIEW,), E.REVIEW_REJECTED, T.FAILED_FINAL, "settle the provider cost, notify"),
        Rule(DEADLINE_GOVERNS, E.DEADLINE_PASSED, T.EXPIRED, "deadline passed: settle or release, notify"),
    ],
)

#: the main line, used to tell a stale observation (its stage is behind us) from an illegal one.
TASK_CHAIN: tuple[TaskStatus, ...] = (
    T.CREATED,
    T.VALIDATING,
    T.QUOTA_RESERVED,
    T.QUEUED,
    T.DISPATCHING,
    T.SUBMITTED,
    T.RUNNING,
    T.OUTPUT_FETCHING,
    T.POST_PROCESSING,
    T.SUCCEEDED,
)


class Effect(StrEnum):
    """What must be recorded in the same transaction as the status change. `services.transition.execute` carries
    out every effect of a decision and refuses one it has no handler for. Entering QUEUED needs no effect: the
    dispatcher scans QUEUED tasks itself (the executor only wakes it)."""

    RESERVE_CREDITS = "reserve_credits"
    CREATE_ATTEMPT = "create_attempt"
    SUBMIT_TO_PROVIDER = "submit_to_provider"
    BIND_PROVIDER_JOB = "bind_provider_job"
    SCHEDULE_POLL = "schedule_poll"
    SCHEDULE_RECONCILE = "schedule_reconcile"
    MARK_RESUBMITTED_AFTER_UNKNOWN = "mark_resubmitted_after_unknown"
    SCHEDULE_RETRY = "schedule_retry"
    REQUEST_OUTPUT_FETCH = "request_output_fetch"
    REQUEST_MEDIA_PROCESSING = "request_media_processing"
    OPEN_REVIEW_ITEM = "open_review_item"
    REQUEST_PROVIDER_CANCEL = "request_provider_cancel"
    SETTLE_CREDITS = "settle_credits"  # actual cost; the remainder of the reservation returns
    RELEASE_CREDITS = "release_credits"  # no provider cost: the whole reservation returns
    SETTLE_PER_BILLING_RULE = "settle_per_billing_rule"  # a provider job may have been billed
    #: nothing delivered, and not by the tenant's doing: the whole reservation returns and whatever the vendor
    #: billed for the task is platform cost
    ABSORB_PROVIDER_COST = "absorb_provider_cost"
    NOTIFY = "notify"  # task.status.changed, on every applied transition


_EVENT_EFFECTS: dict[TaskEvent, tuple[Effect, ...]] = {
    E.VALIDATION_PASSED: (Effect.RESERVE_CREDITS,),
    E.DISPATCH_CLAIMED: (Effect.CREATE_ATTEMPT, Effect.SUBMIT_TO_PROVIDER),
    E.PROVIDER_ACCEPTED: (Effect.BIND_PROVIDER_JOB, Effect.SCHEDULE_POLL),
    E.SUBMIT_AMBIGUOUS: (Effect.SCHEDULE_RECONCILE,),
    E.PROVIDER_JOB_FOUND: (Effect.BIND_PROVIDER_JOB, Effect.SCHEDULE_POLL),
    E.CONFIRMED_NOT_CREATED: (Effect.MARK_RESUBMITTED_AFTER_UNKNOWN, Effect.SCHEDULE_RETRY),
    E.PROVIDER_SUCCEEDED: (Effect.REQUEST_OUTPUT_FETCH,),
    E.OUTPUT_PERSISTED: (Effect.REQUEST_MEDIA_PROCESSING,),
    E.PLAYABLE_ASSET_READY: (Effect.SETTLE_CREDITS,),
    E.RETRYABLE_FAILURE: (Effect.SCHEDULE_RETRY,),
    E.COMPLETION_WON: (Effect.REQUEST_OUTPUT_FETCH,),
    E.REVIEW_REQUIRED: (Effect.OPEN_REVIEW_ITEM,),
    E.REVIEW_APPROVED: (Effect.SETTLE_CREDITS,),
}


def _closing_credit_effect(source: TaskStatus, event: TaskEvent) -> tuple[Effect, ...]:
    """How the reservation is closed when a task ends other than by success: by what it may have cost, and by
    whose doing it ends without delivering.

    The tenant's own decisions pay per the vendor's billing: a cancel (CANCEL_REQUESTED, however it then ends),
    the deadline it asked for (or accepted) running out before the vendor produced anything, and a reviewer's
    reject of a held output. Every other failure — the vendor's, our fetch, store, media or QC, a review SLA
    verdict — delivers nothing through no fault of the tenant: it pays nothing, the platform bears the bill."""
    if source in (T.CREATED, T.VALIDATING):
        return ()  # nothing reserved yet
    if source in (T.QUOTA_RESERVED, T.QUEUED):
        return (Effect.RELEASE_CREDITS,)
    if event is E.FINAL_FAILURE and source is not T.CANCEL_REQUESTED:
        return (Effect.ABSORB_PROVIDER_COST,)
    if event is E.REVIEW_REJECTED:
        return (Effect.SETTLE_CREDITS,)  # the vendor delivered and a person refused it: its cost is the tenant's
    return (Effect.SETTLE_PER_BILLING_RULE,)


def task_effects(edge: Edge[TaskStatus, TaskEvent]) -> tuple[Effect, ...]:
    effects = list(_EVENT_EFFECTS.get(edge.event, ()))
    if edge.event is E.CANCEL_REQUESTED and edge.target is T.CANCEL_REQUESTED:
        effects.append(Effect.SCHEDULE_RECONCILE if edge.source is T.SUBMIT_UNKNOWN else Effect.REQUEST_PROVIDER_CANCEL)
    if edge.event is E.DEADLINE_PASSED and edge.source in (*WITH_PROVIDER_JOB, T.CANCEL_REQUESTED):
        effects.append(Effect.REQUEST_PROVIDER_CANCEL)
    if edge.target in TASK_TERMINAL and edge.target is not T.SUCCEEDED:
        effects.extend(_closing_credit_effect(edge.source, edge.event))
    effects.append(Effect.NOTIFY)
    return tuple(effects)


# ---------------------------------------------------------------------------------------------- attempts


class AttemptEvent(StrEnum):
    SEND_STARTED = "send_started"
    PROVIDER_ACCEPTED = "provider_accepted"
    SUBMIT_AMBIGUOUS = "submit_ambiguous"
    REJECTED_BEFORE_ACCEPT = "rejected_before_accept"
    PROVIDER_JOB_FOUND = "provider_job_found"
    CONFIRMED_NOT_CREATED = "confirmed_not_created"
    PROVIDER_RUNNING = "provider_running"
    PROVIDER_SUCCEEDED = "provider_succeeded"
    PROVIDER_FAILED = "provider_failed"
    CANCEL_CONFIRMED = "cancel_confirmed"
    #: its task ended without the job's end being applied to it: the job is stopped and no longer followed
    TASK_ENDED = "task_ended"


A = AttemptStatus
AE = AttemptEvent

ATTEMPT_MACHINE: Machine[AttemptStatus, AttemptEvent] = Machine(
    "attempt",
    AttemptStatus,
    AttemptEvent,
    initial=A.NEW,
    terminal=ATTEMPT_TERMINAL,
    rules=[
        Rule((A.NEW,), AE.SEND_STARTED, A.SENDING, "tx A, before the call"),
        Rule((A.SENDING,), AE.PROVIDER_ACCEPTED, A.ACKED, "job id recorded"),
        Rule((A.SENDING,), AE.SUBMIT_AMBIGUOUS, A.UNKNOWN, "timeout after the request was sent"),
        Rule((A.NEW, A.SENDING), AE.REJECTED_BEFORE_ACCEPT, A.FAILED_BEFORE_ACCEPT, "confirmed never accepted"),
        Rule((A.UNKNOWN,), AE.PROVIDER_JOB_FOUND, A.ACKED, "reconciliation found the job"),
        Rule((A.UNKNOWN,), AE.CONFIRMED_NOT_CREATED, A.FAILED_BEFORE_ACCEPT, "reconciliation: no such job"),
        Rule((A.ACKED,), AE.PROVIDER_RUNNING, A.RUNNING, ""),
        Rule((A.ACKED, A.RUNNING), AE.PROVIDER_SUCCEEDED, A.SUCCEEDED, ""),
        Rule((A.ACKED, A.RUNNING), AE.PROVIDER_FAILED, A.FAILED, ""),
        Rule((A.ACKED, A.RUNNING), AE.CANCEL_CONFIRMED, A.CANCELED, ""),
        Rule((A.ACKED, A.RUNNING), AE.TASK_ENDED, A.CANCELED, "the sweeper closes an attempt its ended task left"),
    ],
)

ATTEMPT_CHAIN: tuple[AttemptStatus, ...] = (A.NEW, A.SENDING, A.ACKED, A.RUNNING, A.SUCCEEDED)

# --------------------------------------------------------------------------------------------- decide()


class RejectionKind(StrEnum):
    ILLEGAL = "illegal"  # no such edge from this state
    STALE = "stale"  # observed an older version, or describes a stage already passed
    DUPLICATE = "duplicate"  # the task is already where this event leads
    TERMINAL = "terminal"  # terminal states are sticky


@dataclass(frozen=True, slots=True)
class Trigger:
    """An event as it reaches `decide`."""

    event: TaskEvent
    #: the task version the sender observed; a mismatch makes the trigger stale.
    expected_version: int | None = None
    #: provider-reported progress, 0–100; display only.
    progress: int | None = None


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    status: TaskStatus
    version: int = 0
    progress: int = 0
    deadline_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    from_status: TaskStatus
    to_status: TaskStatus
    event: TaskEvent
    version: int
    progress: int
    effects: tuple[Effect, ...]
    cancel_outcome: CancelOutcome | None = None
    decided_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.to_status in TASK_TERMINAL


@dataclass(frozen=True, slots=True)
class Rejection:
    kind: RejectionKind
    status: StrEnum
    event: StrEnum
    reason: str
    #: a late event contradicts a terminal state: record it and raise an alert, never apply it.
    anomaly: bool = False
    effects: tuple[Effect, ...] = field(default=())


_SUCCESS_FACTS = {E.PROVIDER_SUCCEEDED, E.COMPLETION_WON, E.OUTPUT_PERSISTED, E.PLAYABLE_ASSET_READY, E.REVIEW_APPROVED}
_FAILURE_FACTS = {E.FINAL_FAILURE, E.RETRYABLE_FAILURE}


def decide(task: TaskSnapshot, trigger: Trigger | TaskEvent, now: datetime) -> Decision | Rejection:
    """The one task transition function. Pure: `now` is the injected clock's reading."""
    if isinstance(trigger, TaskEvent):
        trigger = Trigger(trigger)
    event = trigger.event
    if task.status in TASK_TERMINAL:
        anomaly = (task.status is not T.SUCCEEDED and event in _SUCCESS_FACTS) or (
            task.status is T.SUCCEEDED and event in _FAILURE_FACTS
        )
        return Rejection(RejectionKind.TERMINAL, task.status, event, f"{task.status} is terminal", anomaly)
    if trigger.expected_version is not None and trigger.expected_version != task.version:
        return Rejection(
            RejectionKind.STALE,
            task.status,
            event,
            f"observed version {trigger.expected_version}, task is at {task.version}",
        )
    edge = TASK_MACHINE.edge(task.status, event)
    if edge is None:
        return _no_edge(TASK_MACHINE, TASK_CHAIN, task.status, event)
    if event is E.DEADLINE_PASSED and (task.deadline_at is None or now < task.deadline_at):
        return Rejection(RejectionKind.ILLEGAL, task.status, event, "deadline not reached")

    progress = max(task.progress, _clamp(trigger.progress))
    if edge.target is T.SUCCEEDED:
        progress = 100
    outcome = {E.COMPLETION_WON: CancelOutcome.TOO_LATE, E.CANCEL_CONFIRMED: CancelOutcome.CANCELED}.get(event)
    return Decision(
        from_status=task.status,
        to_status=edge.target,
        event=event,
        version=task.version + 1,
        progress=progress,
        effects=task_effects(edge),
        cancel_outcome=outcome,
        decided_at=now,
    )


@dataclass(frozen=True, slots=True)
class AttemptDecision:
    from_status: AttemptStatus
    to_status: AttemptStatus
    event: AttemptEvent


def decide_attempt(status: AttemptStatus, event: AttemptEvent) -> AttemptDecision | Rejection:
    if status in ATTEMPT_TERMINAL:
        return Rejection(RejectionKind.TERMINAL, status, event, f"attempt {status} is terminal")
    edge = ATTEMPT_MACHINE.edge(status, event)
    if edge is None:
        return _no_edge(ATTEMPT_MACHINE, ATTEMPT_CHAIN, status, event)
    return AttemptDecision(status, edge.target, event)


def _no_edge(machine: Machine, chain: tuple, status: StrEnum, event: StrEnum) -> Rejection:  # type: ignore[type-arg]
    targets = {e.target for e in machine.edges() if e.event == event}
    if status in targets:
        return Rejection(RejectionKind.DUPLICATE, status, event, f"already {status}")
    if status in chain and targets and all(t in chain and chain.index(t) < chain.index(status) for t in targets):
        return Rejection(RejectionKind.STALE, status, event, f"{event} describes a stage before {status}")
    return Rejection(RejectionKind.ILLEGAL, status, event, f"no transition from {status} on {event}")


def _clamp(progress: int | None) -> int:
    if progress is None:
        return 0
    return max(0, min(100, int(progress)))
