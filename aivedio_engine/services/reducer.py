"""The one reducer for `provider.status.observed`, whether the observation came from a callback or a poll.

Runs inside `consume_once` (inbox dedup in the same transaction). It dedupes by source event id or fingerprint,
ignores observations older than the newest one applied (`provider_updated_at`), moves the attempt and then
the task through their machines with a version CAS, and records every observation it does not apply with the
reason (duplicate / stale / illegal / anomaly). A contradiction of a terminal state (success after CANCELED)
raises an alert and is never applied.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aivedio_engine.db import alerts, attempts, observing, tasks, wakeup
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.db.session import pg_transaction
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import (
    ATTEMPT_IN_FLIGHT,
    TASK_TERMINAL,
    AlertSeverity,
    AttemptStatus,
    EventSource,
    StateEventOutcome,
    TaskStatus,
)
from aivedio_engine.domain.transitions import (
    AttemptDecision,
    AttemptEvent,
    Decision,
    Rejection,
    RejectionKind,
    TaskEvent,
    Trigger,
    decide,
    decide_attempt,
)
from aivedio_engine.providers.base import JobStatus
from aivedio_engine.services import billing, late_jobs, observations
from aivedio_engine.services import reducer_cases as cases
from aivedio_engine.services.after_commit import AfterCommit, finished_lease, release_if_finished
from aivedio_engine.services.consume import DUPLICATE, PROCESSED, Envelope, Outcome, consume_once
from aivedio_engine.services.transition import (
    Change,
    FetchOrder,
    execute,
    lock_existing_attempt,
)
from aivedio_engine.slots.base import Lease, SlotStore
from aivedio_engine.testing.failpoints import failpoint

_ATTEMPT_EVENT = {
    JobStatus.RUNNING: AttemptEvent.PROVIDER_RUNNING,
    JobStatus.SUCCEEDED: AttemptEvent.PROVIDER_SUCCEEDED,
    JobStatus.FAILED: AttemptEvent.PROVIDER_FAILED,
    JobStatus.ABORTED: AttemptEvent.PROVIDER_FAILED,
    JobStatus.CANCELED: AttemptEvent.CANCEL_CONFIRMED,
}
#: task states in which the task's attempt may still be in flight at the provider
_WITH_A_JOB = frozenset(
    {
        TaskStatus.DISPATCHING,
        TaskStatus.SUBMITTED,
        TaskStatus.RUNNING,
        TaskStatus.SUBMIT_UNKNOWN,
        TaskStatus.CANCEL_REQUESTED,
    }
)
_OUTCOME = {
    RejectionKind.DUPLICATE: StateEventOutcome.DUPLICATE,
    RejectionKind.STALE: StateEventOutcome.STALE,
    RejectionKind.ILLEGAL: StateEventOutcome.ILLEGAL,
    RejectionKind.TERMINAL: StateEventOutcome.STALE,
}


def task_event_for(status: JobStatus, task_status: str) -> TaskEvent | None:
    """Which task event an observed job status means, given where the task is."""
    canceling = task_status == TaskStatus.CANCEL_REQUESTED.value
    return {
        JobStatus.RUNNING: TaskEvent.PROVIDER_RUNNING,
        JobStatus.SUCCEEDED: TaskEvent.COMPLETION_WON if canceling else TaskEvent.PROVIDER_SUCCEEDED,
        JobStatus.FAILED: TaskEvent.CANCEL_CONFIRMED if canceling else TaskEvent.FINAL_FAILURE,
        # not started, not billed: the request may go again
        JobStatus.ABORTED: TaskEvent.CANCEL_CONFIRMED if canceling else TaskEvent.RETRYABLE_FAILURE,
        JobStatus.CANCELED: TaskEvent.CANCEL_CONFIRMED if canceling else TaskEvent.FINAL_FAILURE,
    }.get(status)


def reduce(conn: Connection, obs: dict[str, Any], now: datetime, urgent_fetch_s: float, after: AfterCommit) -> str:
    """Apply one observation (the outbox payload built by `services.observations`). Returns a digest.

    The task and then its attempt are locked (the engine's one lock order, `transition.lock_attempt`) before
    either is read for a decision: read without its lock, a concurrent reducer could move the attempt between
    the read and the writes, and the task would move while the attempt kept its old state and its slot. When
    the attempt ends up terminal its slot goes to `after`, freed once this transaction has committed. An
    observation no attempt owns yet (a callback that beat the submit's answer) is kept as an orphan, which
    binding the job id replays (`observations.rematch`)."""
    found = attempts.by_job(conn, obs["provider"], obs["job_id"])  # unlocked, for its id only
    if found is not None:
        task, attempt = lock_existing_attempt(conn, found.id)
    else:
        task, attempt = cases.bind_ambiguous(conn, obs, now, after)
        if attempt is None:
            task, attempt = cases.bind_closed(conn, obs, now)
    if attempt is None:
        observations.keep_as_orphan(conn, obs)
        return "unmatched"
    return reduce_locked(conn, attempt, task, obs, now, urgent_fetch_s, after)


def reduce_locked(
    conn: Connection,
    attempt: Attempt,
    task: Task,
    obs: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float,
    after: AfterCommit,
    seen: bool | None = None,
) -> str:
    """Reduce on the locked rows; the attempt's slot, if it is (now) terminal, is freed after the commit: also
    when an earlier delivery ended it and died before freeing it."""
    moved: dict[str, AttemptStatus] = {}
    digest = _reduce_locked(conn, attempt, task, obs, now, urgent_fetch_s, after, moved, seen)
    after.release(finished_lease(attempt, task.tenant_id, moved.get("to")))
    return digest


def _reduce_locked(
    conn: Connection,
    attempt: Attempt,
    task: Task,
    obs: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float,
    after: AfterCommit,
    moved: dict[str, AttemptStatus],
    seen: bool | None,
) -> str:
    source = EventSource(obs["source"])
    if seen is None:
        seen = observing.seen(conn, source.value, obs["dedup_key"])
    if seen:
        return "duplicate"
    status = JobStatus(obs["status"])
    if late_jobs.is_closed(attempt):  # a duplicate job (services/late_jobs.py): the task went on without it
        base = dict(task_id=task.id, source=EventSource(obs["source"]), source_event_id=obs["dedup_key"], now=now)
        base.update(attempt_id=attempt.id, provider_updated_at=_ts(obs.get("provider_updated_at")))
        why = f"job {obs['job_id']} is a recorded duplicate of an attempt closed as never created"
        cases.record(conn, task, status, StateEventOutcome.DUPLICATE, {**base, "payload": _summary(obs)}, why)
        return "duplicate-job"
    observed_at = _ts(obs.get("provider_updated_at"))
    base = dict(
        task_id=task.id,
        source=source,
        source_event_id=obs["dedup_key"],
        now=now,
        attempt_id=attempt.id,
        provider_updated_at=observed_at,
        payload=_summary(obs),
    )

    if attempt.provider_updated_at and observed_at and observed_at < attempt.provider_updated_at:
        why = "older than the newest applied observation" + cases.stale_bill(conn, task, attempt, obs, now)
        cases.record(conn, task, status, StateEventOutcome.STALE, base, why)
        return "stale"
    if status is JobStatus.SUCCEEDED and int(task.current_attempt_no) != int(attempt.attempt_no):
        # a success of a superseded attempt: a second paid job exists (ambiguous submit resubmitted)
        cases.record(conn, task, status, StateEventOutcome.ANOMALY, base, "success of a superseded attempt")
        alerts.raise_alert(
            conn,
            alerts.Rule.DUPLICATE_PROVIDER_JOB,
            AlertSeverity.WARNING,
            dedup_key=f"{attempt.provider}:{attempt.provider_job_id}",
            now=now,
            subject_type="task",
            subject_id=str(task.id),
            message=f"provider {attempt.provider} finished superseded job {attempt.provider_job_id}",
        )
        return "anomaly"

    _move_attempt(conn, attempt, status, obs, observed_at, now, moved)
    if TaskStatus(task.status) in TASK_TERMINAL:
        if obs.get("refunded") is True:
            return cases.late_refund(conn, task, attempt, status, base, now)
        if attempts.bill_values(obs) and int(attempt.attempt_no) == int(task.current_attempt_no or 0):
            billing.settle_late_bill(conn, task, now, attempt_id=attempt.id)  # then recorded as before
    event = task_event_for(status, task.status)
    if event is None:  # queued / throttled: nothing to decide, but progress is worth showing
        _progress_only(conn, task, obs.get("progress"), now)
        cases.record(conn, task, status, StateEventOutcome.DUPLICATE, base, f"{status.value}: no task transition")
        return "no-op"
    result = decide(tasks.snapshot(task), Trigger(event, progress=obs.get("progress")), now)
    if isinstance(result, Rejection):
        outcome = StateEventOutcome.ANOMALY if result.anomaly else _OUTCOME[result.kind]
        cases.record(conn, task, status, outcome, base, result.reason, event_type=event.value)
        if result.anomaly:
            alerts.raise_alert(
                conn,
                alerts.Rule.LATE_EVENT_AFTER_TERMINAL,
                AlertSeverity.WARNING,
                dedup_key=f"{task.id}:{status.value}",
                now=now,
                subject_type="task",
                subject_id=str(task.id),
                message=f"{status.value} from {attempt.provider} after the task was {task.status}",
            )
        if result.kind is RejectionKind.DUPLICATE:
            _progress_only(conn, task, obs.get("progress"), now)
        return outcome.value
    _apply(conn, task, attempt, result, obs, base, now, urgent_fetch_s, after, moved)
    return f"applied:{result.to_status.value}"


def _move_attempt(
    conn: Connection,
    attempt: Attempt,
    status: JobStatus,
    obs: dict[str, Any],
    observed_at: datetime | None,
    now: datetime,
    moved: dict[str, AttemptStatus],
) -> None:
    values: dict[str, Any] = {}
    if observed_at and (attempt.provider_updated_at is None or observed_at > attempt.provider_updated_at):
        values["provider_updated_at"] = observed_at
    expiries = [_ts(o.get("expires_at")) for o in obs.get("outputs", []) if o.get("expires_at")]
    if expiries:
        values["output_url_expires_at"] = min(e for e in expiries if e)
    event = _ATTEMPT_EVENT.get(status)
    if event is not None and isinstance(decide_attempt(AttemptStatus(attempt.submit_state), event), AttemptDecision):
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ABORTED, JobStatus.CANCELED):
            values["completed_at"] = now
            values.update(attempts.bill_values(obs))  # what the vendor billed: settlement reads it here
        if status is not JobStatus.SUCCEEDED and obs.get("error_code"):
            values["provider_error_code"] = str(obs["error_code"])[:128]
        # both rows are locked, so the CAS cannot lose; if it ever did, AttemptConflict refuses the whole
        # transaction (the message is retried) rather than let the task move without its attempt
        moved["to"] = attempts.transition(conn, attempt, event, now, **values).to_status
        return
    # otherwise a late or repeated status for the attempt: its own state already says more, except a refund (a newer
    # fact than the charge it reverses), which the settlement reads from the attempt once the task closes
    if obs.get("refunded") is True and not attempt.vendor_refunded:
        values["vendor_refunded"] = True
    if values:
        attempts.update(conn, attempt.id, **values)


def _apply(
    conn: Connection,
    task: Task,
    attempt: Attempt,
    decision: Decision,
    obs: dict[str, Any],
    base: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float,
    after: AfterCommit,
    moved: dict[str, AttemptStatus],
) -> None:
    attempt_now = AttemptStatus(moved.get("to") or attempt.submit_state)
    if decision.to_status not in _WITH_A_JOB and attempt_now in ATTEMPT_IN_FLIGHT:
        # never half-applied: a task past its provider step with its job's attempt still in flight would keep
        # the slot and be polled forever (issue 14); refused as a whole, the delivery is retried
        raise attempts.AttemptConflict(
            f"task {task.id} would become {decision.to_status} while attempt {attempt.id} is {attempt_now}"
        )
    columns: dict[str, Any] = {}
    if decision.from_status in (TaskStatus.SUBMITTED, TaskStatus.DISPATCHING) and task.started_at is None:
        columns["started_at"] = now
    failed = decision.event in (TaskEvent.FINAL_FAILURE, TaskEvent.RETRYABLE_FAILURE)
    if decision.event is TaskEvent.RETRYABLE_FAILURE:
        columns["next_retry_at"] = now  # aborted before it started: nothing to back off from
    change = Change(
        base["source"],
        source_event_id=base["source_event_id"],
        payload=base["payload"],
        columns=columns,
        error=ErrorOutcome.PROVIDER_FAILED if failed else None,
        error_code=(obs.get("error_code") or obs["status"]) if failed else None,
        fetch=FetchOrder(attempt, tuple(obs.get("outputs", [])), urgent_fetch_s),
        billed=obs.get("billed"),
        failpoint_after_cas="reducer.after_cas",
    )
    execute(conn, task, decision, change, now, after)


def _progress_only(conn: Connection, task: Task, progress: Any, now: datetime) -> None:
    if isinstance(progress, int) and 0 <= progress <= 100 and progress > task.progress:
        tasks.set_columns(conn, task.id, progress=progress, updated_at=now)


def _summary(obs: dict[str, Any]) -> dict[str, Any]:
    """What the timeline keeps: never output URLs (signed query strings) or long messages."""
    return {
        "provider": obs["provider"],
        "job_id": obs["job_id"],
        "status": obs["status"],
        "progress": obs.get("progress"),
        "error_code": obs.get("error_code"),
        "outputs": len(obs.get("outputs", [])),
    }


def _ts(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


CONSUMER_GROUP = "reducer"


@dataclass(frozen=True, slots=True)
class Reduced:
    outcome: Outcome
    #: the slot of an attempt this event found terminal; freed after the commit when the caller gave `slots`
    finished_lease: Lease | None = None


def reduce_event(engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float = 900) -> Outcome:
    """Consume one `provider.status.observed` event exactly once in effect."""
    return reduce_observation(engine, envelope, now, urgent_fetch_s).outcome


def reduce_observation(
    engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float = 900, slots: SlotStore | None = None
) -> Reduced:
    """Consume one observation; once committed, free the slot of an attempt it left (or found) terminal."""
    after = _Leases(engine, slots)
    if engine.dialect.name == "postgresql":
        outcome = _reduce_pg(engine, envelope, now, urgent_fetch_s, after)
    else:
        outcome = consume_once(
            engine,
            CONSUMER_GROUP,
            envelope.event_id,
            envelope.aggregate_id,
            lambda conn: reduce(conn, envelope.payload, now, urgent_fetch_s, after),
            now,
        )
        if outcome == DUPLICATE and slots is not None:
            # the first delivery may have committed and died before freeing the slot: check from the rows
            attempt_id = attempt_of(engine, envelope.payload)
            if attempt_id is not None:
                release_if_finished(engine, slots, attempt_id)
    after.run()
    return Reduced(outcome, after.lease)


class _Leases(AfterCommit):
    """AfterCommit that also remembers the lease it frees (reported in `Reduced`)."""

    lease: Lease | None = None

    def release(self, lease: Lease | None) -> None:
        if lease is not None:
            self.lease = lease
        super().release(lease)


def attempt_of(engine: Engine, obs: dict[str, Any]) -> uuid.UUID | None:
    """The attempt an observation is about (None while it is an orphan)."""
    with engine.connect() as conn:
        row = attempts.by_job(conn, obs["provider"], obs["job_id"])
    return None if row is None else row.id


def _reduce_pg(engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float, after: AfterCommit) -> Outcome:
    """`consume_once` + `reduce` in as few round trips as the protocol allows: BEGIN with the four reads, the
    writes, then the inbox digest with COMMIT — 6 for a new RUNNING observation, 2 for a duplicate delivery
    (counted 22 and 13 at the actor)."""
    obs = envelope.payload
    with engine.connect() as conn:
        with pg_transaction(conn) as raw:
            got = observing.claim(
                raw,
                group=CONSUMER_GROUP,
                event_id=envelope.event_id,
                aggregate_id=envelope.aggregate_id,
                now=now,
                provider=obs["provider"],
                job_id=obs["job_id"],
                source=obs["source"],
                dedup_key=obs["dedup_key"],
            )
            if not got.fresh:
                failpoint("consume.duplicate")
                observing.commit(raw, group=CONSUMER_GROUP, event_id=envelope.event_id, digest=None)  # wrote nothing
                # the first delivery may have committed and died before freeing the slot: free it from these rows
                if got.attempt is not None and got.task is not None:
                    after.release(finished_lease(got.attempt, got.task.tenant_id))
                return DUPLICATE
            if got.attempt is None or got.task is None:  # an orphan, or bound by request key: the general path
                digest = reduce(conn, obs, now, urgent_fetch_s, after)
            else:
                digest = reduce_locked(conn, got.attempt, got.task, obs, now, urgent_fetch_s, after, seen=got.seen)
            failpoint("consume.before_commit")
            failpoint("reducer.before_commit")
            observing.commit(raw, group=CONSUMER_GROUP, event_id=envelope.event_id, digest=digest)
        wakeup.flush_noted(engine, conn)
    failpoint("reducer.after_commit")
    return PROCESSED
