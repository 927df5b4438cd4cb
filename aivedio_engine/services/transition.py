"""The one transition executor: every applied task transition goes through `execute`.

`decide()` (domain/transitions.py) says what a trigger does to a task: the target state, the new version and
the `Effect`s that must be recorded with it. `execute` takes that Decision, the task row the caller read under
its lock and a `Change` (who caused it, the state event's payload, extra column values, the attempt's own move,
and what some effects need to know), and carries out every effect in the caller's transaction:

- the version CAS, the `task_state_events` row and `task.status.changed` (`db.tasks.apply`: one statement on
  PostgreSQL), with `last_error_class` taken only from an `ErrorClass`;
- the attempt's move (`move_attempt`) and a new attempt (CREATE_ATTEMPT);
- follow-on outbox rows, one typed payload per event type (`services.follow_on`): SUBMIT_TO_PROVIDER,
  REQUEST_OUTPUT_FETCH, REQUEST_MEDIA_PROCESSING;
- schedules kept on the task row (SCHEDULE_RETRY, SCHEDULE_RECONCILE, REQUEST_PROVIDER_CANCEL) or checked on the
  attempt's move (BIND_PROVIDER_JOB, SCHEDULE_POLL, MARK_RESUBMITTED_AFTER_UNKNOWN);
- the review item (OPEN_REVIEW_ITEM; leaving MANUAL_REVIEW otherwise closes it);
- the ledger rows of a closing edge (`billing.close_reservation`).

Each effect has exactly one handler in `_HANDLERS`; an effect without one, or one whose `Change` lacks what its
handler needs, raises before anything is written, so no effect can be silently dropped again.

Work that must wait for the commit goes to an `AfterCommit` (`services/after_commit.py`) the caller runs once its
transaction has committed: freeing the slot of an attempt that ended (it used to be done by the actors), and
stopping a provider job that an expired task leaves behind. Nothing there is needed for correctness: a lost
release is rebuilt by the slot reconciler, a lost cancel only costs money the sweeper already accounted for.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from aivedio_engine.db import attempts, lock_order, reviews, tasks, wakeup
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.domain.events import fetch_route
from aivedio_engine.domain.retry import ErrorOutcome, LastError, last_error_value
from aivedio_engine.domain.status import ATTEMPT_TERMINAL, EventSource, ReviewState, TaskStatus
from aivedio_engine.domain.transitions import (
    AttemptDecision,
    AttemptEvent,
    Decision,
    Effect,
    TaskEvent,
    Trigger,
    decide,
)
from aivedio_engine.services import billing
from aivedio_engine.services.after_commit import AfterCommit, lease_of
from aivedio_engine.services.follow_on import FetchRequested, MediaProcessRequested, Message, SubmitRequested, emit
from aivedio_engine.testing.failpoints import failpoint

VersionConflict = tasks.VersionConflict


class UnhandledEffect(RuntimeError):
    """A decision asks for an effect the executor cannot carry out with what the caller gave it."""


# ------------------------------------------------------------------------------------------------ attempts


def move_attempt(
    conn: Connection,
    attempt: Attempt,
    event: AttemptEvent,
    now: datetime,
    *,
    tenant_id: uuid.UUID,
    after: AfterCommit,
    error: LastError | None = None,
    **values: Any,
) -> AttemptDecision:
    """Move an attempt by its machine (CAS on its state); an attempt that ends frees its slot after the commit.
    Refused unless its task is locked in this transaction (`lock_attempt`: the one lock order)."""
    lock_order.require_task_locked(conn, attempt.task_id, attempt.id)
    moved = attempts.transition(conn, attempt, event, now, error=error, **values)
    if moved.to_status in ATTEMPT_TERMINAL:
        after.release(lease_of(attempt, tenant_id))
    return moved


def lock_attempt(conn: Connection, attempt_id: uuid.UUID) -> tuple[Task | None, Attempt | None]:
    """The engine's lock order (`db.lock_order`): the attempt's task row first, then the attempt, both locked in
    the caller's transaction. Returns (task, attempt), or (None, None) when the attempt does not exist. Read
    this way, the attempt cannot move between the read and the caller's writes, so a move of it is applied
    with the task's or the whole transaction is refused."""
    task_id = attempts.task_of(conn, attempt_id)
    if task_id is None:
        return None, None
    task = tasks.read(conn, task_id, lock=True)
    return task, attempts.read(conn, attempt_id, lock=True)


def lock_existing_attempt(conn: Connection, attempt_id: uuid.UUID) -> tuple[Task, Attempt]:
    """`lock_attempt` of an attempt that must exist (one a row or the caller's own read names: attempts are never
    deleted while their task lives); LookupError otherwise."""
    task, attempt = lock_attempt(conn, attempt_id)
    if task is None or attempt is None:
        raise LookupError(f"attempt {attempt_id} (or its task) does not exist")
    return task, attempt


# -------------------------------------------------------------------------------------------------- change


@dataclass(frozen=True, slots=True)
class AttemptMove:
    """The attempt's own transition, carried out with the task's (both locked, the task first)."""

    attempt: Attempt
    event: AttemptEvent
    values: Mapping[str, Any] = field(default_factory=dict)
    error: LastError | None = None


@dataclass(frozen=True, slots=True)
class NewAttempt:
    attempt_id: uuid.UUID
    provider: str
    model: str
    fencing_token: int | None
    resubmitted_after_unknown: bool = False


@dataclass(frozen=True, slots=True)
class FetchOrder:
    attempt: Attempt
    outputs: tuple[dict[str, Any], ...]
    urgent_within_s: float


@dataclass(frozen=True, slots=True)
class ReviewOrder:
    asset_id: uuid.UUID | None
    reason: str


@dataclass(frozen=True, slots=True)
class Change:
    """Everything about one transition that `decide` does not know."""

    source: EventSource
    #: the state event's dedup id; default "<task id>:<new version>"
    source_event_id: str | None = None
    payload: Mapping[str, Any] | None = None
    #: other task columns to set with the transition (never status, version or last_error_class)
    columns: Mapping[str, Any] = field(default_factory=dict)
    error: LastError | None = None
    error_code: str | None = None
    attempt: AttemptMove | None = None
    new_attempt: NewAttempt | None = None
    fetch: FetchOrder | None = None
    review: ReviewOrder | None = None
    #: REQUEST_MEDIA_PROCESSING: every raw output to process, one message each (empty: `output_asset_id` alone)
    media_assets: tuple[uuid.UUID, ...] = ()
    #: REQUEST_MEDIA_PROCESSING: the caller runs the media step itself once this transaction has committed
    #: (`Executed.media`), so no message is written; if it dies first, the sweeper finds the task
    #: POST_PROCESSING with no pending request and writes one (services/sweeper.py)
    media_inline: bool = False
    #: the provider's billing verdict, for SETTLE_PER_BILLING_RULE
    billed: bool | None = None
    ledger_reason: str | None = None
    #: a success: how many of the task's outputs were delivered (required derivatives READY); its charge is capped
    #: at their quoted price. Required for every transition into SUCCEEDED.
    delivered: int | None = None
    created_by: str = "engine"
    #: stops a live provider job after the commit, when the task ends while one runs (REQUEST_PROVIDER_CANCEL)
    cancel_job: Callable[[Any], object] | None = None
    #: a named failure point armed between the CAS and the follow-on rows (chaos tests)
    failpoint_after_cas: str | None = None


@dataclass(frozen=True, slots=True)
class Executed:
    decision: Decision
    #: the actual cost booked by a closing edge (None when the edge booked nothing)
    booked: Decimal | None = None
    attempt: AttemptDecision | None = None
    #: the media requests the caller runs itself after the commit (Change.media_inline)
    media: tuple[MediaProcessRequested, ...] = ()


@dataclass
class _Plan:
    task: Task
    decision: Decision
    change: Change
    now: datetime
    columns: dict[str, Any]
    attempt_values: dict[str, Any]
    attempt_error: LastError | None
    messages: list[tuple[Message, Any]] = field(default_factory=list)
    inline_media: list[MediaProcessRequested] = field(default_factory=list)
    create_attempt: NewAttempt | None = None
    review: ReviewOrder | None = None
    close_credits: bool = False
    cancel_live_job: bool = False


# ------------------------------------------------------------------------------------------------ executor


def execute(
    conn: Connection, task: Task, decision: Decision, change: Change, now: datetime, after: AfterCommit | None = None
) -> Executed:
    """Carry out `decision` for `task` (read under its lock in this transaction) and every one of its effects.
    Raises UnhandledEffect before writing anything when an effect cannot be carried out, VersionConflict when
    the task moved since it was read. `after` is needed when the transition leaves work for after the commit
    (an attempt move, a provider cancel); the caller runs it once its transaction has committed."""
    if {"status", "version", "last_error_class", "last_error_code"} & change.columns.keys():
        raise ValueError("status, version and the error are set by the executor, not through Change.columns")
    plan = _Plan(
        task,
        decision,
        change,
        now,
        columns=dict(change.columns),
        attempt_values=dict(change.attempt.values) if change.attempt else {},
        attempt_error=change.attempt.error if change.attempt else None,
    )
    if decision.to_status is TaskStatus.SUCCEEDED and change.delivered is None:
        raise ValueError("a success says how many outputs it delivered (Change.delivered): its charge depends on it")
    if change.error is not None:
        plan.columns["last_error_class"] = last_error_value(change.error)
        if change.error_code is not None:
            plan.columns["last_error_code"] = change.error_code[:128]
    for effect in decision.effects:
        handler = _HANDLERS.get(effect)
        if handler is None:
            raise UnhandledEffect(f"no handler for {effect} ({decision.event} from {decision.from_status})")
        handler(plan)
    if after is None and (change.attempt is not None or plan.cancel_live_job):
        raise UnhandledEffect(f"{decision.event} leaves work for after the commit: pass an AfterCommit")

    moved = None
    if change.attempt is not None and after is not None:
        moved = move_attempt(
            conn,
            change.attempt.attempt,
            change.attempt.event,
            now,
            tenant_id=task.tenant_id,
            after=after,
            error=plan.attempt_error,
            **plan.attempt_values,
        )
    if plan.create_attempt is not None:
        new = plan.create_attempt
        attempts.create(
            conn,
            task_id=task.id,
            attempt_no=int(plan.columns["current_attempt_no"]),
            provider=new.provider,
            model=new.model,
            params=task.params,
            now=now,
            fencing_token=new.fencing_token,
            attempt_id=new.attempt_id,
            resubmitted_after_unknown=new.resubmitted_after_unknown,
        )
    tasks.apply(
        conn,
        task.id,
        decision,
        source=change.source,
        source_event_id=change.source_event_id or f"{task.id}:{decision.version}",
        now=now,
        extra=plan.columns,
        payload=dict(change.payload) if change.payload is not None else None,
    )
    if change.failpoint_after_cas:
        failpoint(change.failpoint_after_cas)
    for message, route in plan.messages:
        emit(conn, task, message, version=decision.version, now=now, route=route)
    if plan.review is not None:
        reviews.open_item(conn, task_id=task.id, asset_id=plan.review.asset_id, reason=plan.review.reason, now=now)
    elif decision.from_status is TaskStatus.MANUAL_REVIEW and decision.event not in _REVIEW_VERDICTS:
        reviews.expire_open(conn, task.id, by=change.created_by, note=_left_review_note(decision), now=now)
    if decision.to_status is TaskStatus.QUEUED:
        wakeup.notify(conn, wakeup.DISPATCH)  # the dispatcher scans QUEUED tasks; this only makes it look now
    booked = None
    if plan.close_credits:
        booked = billing.close_reservation(
            conn,
            task,
            decision,
            now,
            reason=change.ledger_reason or decision.event.value,
            billed=change.billed,
            created_by=change.created_by,
            delivered=change.delivered,
        )
    if plan.cancel_live_job and change.cancel_job is not None and after is not None:
        live = attempts.current(conn, task.id)
        if live is not None and live.provider_job_id:
            cancel = change.cancel_job
            after.call(lambda: cancel(live))
    return Executed(decision, booked, moved, tuple(plan.inline_media))


def decide_and_execute(
    conn: Connection,
    task: Task,
    event: TaskEvent,
    change: Change,
    now: datetime,
    after: AfterCommit | None = None,
    *,
    progress: int | None = None,
) -> Executed:
    """Decide `event` for the task row just read under its lock and execute it. A rejection means the caller's
    view is out of date, so it surfaces as VersionConflict (the caller's transaction rolls back)."""
    decision = decide(tasks.snapshot(task), Trigger(event, int(task.version), progress), now)
    if not isinstance(decision, Decision):
        raise VersionConflict(f"{event} rejected for task {task.id}: {decision.reason}")
    return execute(conn, task, decision, change, now, after)


_REVIEW_VERDICTS = (TaskEvent.REVIEW_APPROVED, TaskEvent.REVIEW_REJECTED)


def _left_review_note(decision: Decision) -> str:
    if decision.event is TaskEvent.DEADLINE_PASSED:
        return "task expired while waiting for review"
    return f"task became {decision.to_status.value} while waiting for review"


# ------------------------------------------------------------------------------------------------ handlers


def _missing(plan: _Plan, effect: Effect, what: str) -> UnhandledEffect:
    d = plan.decision
    return UnhandledEffect(f"{effect} ({d.event} from {d.from_status}) needs {what}")


def _reserve_credits(plan: _Plan) -> None:
    # the reservation commits with the task itself (db/creation.py), never through a later transition
    raise _missing(plan, Effect.RESERVE_CREDITS, "the creation transaction (db/creation.py)")


def _create_attempt(plan: _Plan) -> None:
    if plan.change.new_attempt is None:
        raise _missing(plan, Effect.CREATE_ATTEMPT, "Change.new_attempt")
    plan.create_attempt = plan.change.new_attempt
    plan.columns["current_attempt_no"] = int(plan.task.current_attempt_no) + 1
    plan.columns.setdefault("selected_provider", plan.change.new_attempt.provider)


def _submit_to_provider(plan: _Plan) -> None:
    new = plan.change.new_attempt
    if new is None:
        raise _missing(plan, Effect.SUBMIT_TO_PROVIDER, "the attempt to submit (Change.new_attempt)")
    plan.messages.append((SubmitRequested(new.attempt_id, plan.task.id), None))


def _attempt_value(plan: _Plan, effect: Effect, column: str) -> None:
    if plan.change.attempt is None or plan.attempt_values.get(column) is None:
        raise _missing(plan, effect, f"the attempt's move with {column}")


def _bind_provider_job(plan: _Plan) -> None:
    _attempt_value(plan, Effect.BIND_PROVIDER_JOB, "provider_job_id")


def _schedule_poll(plan: _Plan) -> None:
    _attempt_value(plan, Effect.SCHEDULE_POLL, "next_poll_at")


def _mark_resubmitted(plan: _Plan) -> None:
    # the next dispatch reads this mark off the previous attempt (task_attempts.resubmitted_after_unknown)
    move = plan.change.attempt
    if move is None or move.event is not AttemptEvent.CONFIRMED_NOT_CREATED:
        raise _missing(plan, Effect.MARK_RESUBMITTED_AFTER_UNKNOWN, "the attempt's CONFIRMED_NOT_CREATED move")
    plan.attempt_error = ErrorOutcome.CONFIRMED_NOT_CREATED


def _schedule_reconcile(plan: _Plan) -> None:
    plan.columns.setdefault("next_action_at", plan.now)


def _schedule_retry(plan: _Plan) -> None:
    # when to retry is the failure policy's call (domain/retry.py), never a default of this executor
    retry_at = plan.columns.get("next_retry_at")
    if retry_at is None:
        raise _missing(plan, Effect.SCHEDULE_RETRY, "columns['next_retry_at']")
    plan.columns.setdefault("next_action_at", retry_at)


def _request_output_fetch(plan: _Plan) -> None:
    order = plan.change.fetch
    if order is None:
        raise _missing(plan, Effect.REQUEST_OUTPUT_FETCH, "Change.fetch")
    message = FetchRequested.of(plan.task.id, order.attempt, order.outputs)
    plan.messages.append((message, fetch_route(message.expiries(), plan.now, order.urgent_within_s)))


def _request_media_processing(plan: _Plan) -> None:
    asset_id = plan.columns.get("output_asset_id")
    if asset_id is None:
        raise _missing(plan, Effect.REQUEST_MEDIA_PROCESSING, "the raw output (columns['output_asset_id'])")
    for each in plan.change.media_assets or (asset_id,):  # one per output: each retries on its own
        request = MediaProcessRequested(plan.task.id, each)
        if plan.change.media_inline:
            plan.inline_media.append(request)
        else:
            plan.messages.append((request, None))


def _open_review_item(plan: _Plan) -> None:
    if plan.change.review is None:
        raise _missing(plan, Effect.OPEN_REVIEW_ITEM, "Change.review")
    plan.review = plan.change.review
    plan.columns.setdefault("review_state", ReviewState.PENDING.value)


def _request_provider_cancel(plan: _Plan) -> None:
    if not plan.decision.finished:
        plan.columns.setdefault("next_action_at", plan.now)  # the canceller (services/sync.py) picks it up
        return
    if plan.change.cancel_job is None:
        raise _missing(plan, Effect.REQUEST_PROVIDER_CANCEL, "Change.cancel_job (the task ends with a live job)")
    plan.cancel_live_job = True


def _close_credits(plan: _Plan) -> None:
    plan.close_credits = True


def _notify(plan: _Plan) -> None:
    """`task.status.changed` is written by `db.tasks.apply` in the same statement as the CAS."""


_HANDLERS: dict[Effect, Callable[[_Plan], None]] = {
    Effect.RESERVE_CREDITS: _reserve_credits,
    Effect.CREATE_ATTEMPT: _create_attempt,
    Effect.SUBMIT_TO_PROVIDER: _submit_to_provider,
    Effect.BIND_PROVIDER_JOB: _bind_provider_job,
    Effect.SCHEDULE_POLL: _schedule_poll,
    Effect.SCHEDULE_RECONCILE: _schedule_reconcile,
    Effect.MARK_RESUBMITTED_AFTER_UNKNOWN: _mark_resubmitted,
    Effect.SCHEDULE_RETRY: _schedule_retry,
    Effect.REQUEST_OUTPUT_FETCH: _request_output_fetch,
    Effect.REQUEST_MEDIA_PROCESSING: _request_media_processing,
    Effect.OPEN_REVIEW_ITEM: _open_review_item,
    Effect.REQUEST_PROVIDER_CANCEL: _request_provider_cancel,
    Effect.SETTLE_CREDITS: _close_credits,
    Effect.RELEASE_CREDITS: _close_credits,
    Effect.SETTLE_PER_BILLING_RULE: _close_credits,
    Effect.ABSORB_PROVIDER_COST: _close_credits,
    Effect.NOTIFY: _notify,
}
