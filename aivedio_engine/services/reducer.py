"""The one reducer for `provider.status.observed`, whether the observation came from a callback or a poll.

Runs inside `consume_once` (inbox dedup in the same transaction). It dedupes by source event id or fingerprint,
ignores observations older than the newest one applied (`provider_updated_at`), moves the attempt and then
the task through their machines with a version CAS, and records every observation it does not apply with the
reason (duplicate / stale / illegal / anomaly). A contradiction of a terminal state (success after CANCELED)
raises an alert and is never applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.db import alerts, attempts, observing, outbox, tasks, wakeup
from aivedio_engine.db.session import pg_transaction
from aivedio_engine.db.tables import generation_tasks, task_attempts, task_state_events
from aivedio_engine.domain.events import EventType, fetch_route
from aivedio_engine.domain.status import (
    ATTEMPT_TERMINAL,
    AlertSeverity,
    AttemptStatus,
    EventSource,
    StateEventOutcome,
    TaskStatus,
)
from aivedio_engine.domain.transitions import (
    AttemptEvent,
    Decision,
    Effect,
    Rejection,
    RejectionKind,
    TaskEvent,
    Trigger,
    decide,
)
from aivedio_engine.providers.base import JobStatus
from aivedio_engine.services import billing
from aivedio_engine.services.consume import DUPLICATE, PROCESSED, Envelope, Outcome, consume_once
from aivedio_engine.services.dispatch import lease_of
from aivedio_engine.slots.base import Lease
from aivedio_engine.testing.failpoints import failpoint

_ATTEMPT_EVENT = {
    JobStatus.RUNNING: AttemptEvent.PROVIDER_RUNNING,
    JobStatus.SUCCEEDED: AttemptEvent.PROVIDER_SUCCEEDED,
    JobStatus.FAILED: AttemptEvent.PROVIDER_FAILED,
    JobStatus.ABORTED: AttemptEvent.PROVIDER_FAILED,
    JobStatus.CANCELED: AttemptEvent.CANCEL_CONFIRMED,
}
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


def reduce(
    conn: Connection,
    obs: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float = 900,
    after: dict[str, Any] | None = None,
) -> str:
    """Apply one observation (the outbox payload built by `services.observations`). Returns a digest.

    The attempt is locked before the task (the order submit's tx B uses): read without its lock, a concurrent
    reducer could move it between the read and the task's lock, and the task would move while the attempt kept
    its old state and its slot. `after["lease"]` is set when the attempt ends up terminal: the caller frees that
    slot once this transaction has committed."""
    attempt = attempts.by_job(conn, obs["provider"], obs["job_id"], lock=True)
    if attempt is None:
        attempt = _bind_ambiguous(conn, obs, now)
    if attempt is None:
        return "unmatched"
    task = tasks.read(conn, attempt.task_id, lock=True)
    moved: dict[str, AttemptStatus] = {}
    digest = _reduce(conn, attempt, task, obs, now, urgent_fetch_s, moved)
    if after is not None:
        after["lease"] = _finished_lease(attempt, task, moved.get("to"))
    return digest


def _finished_lease(attempt: Any, task: Any, now_in: AttemptStatus | None = None) -> Lease | None:
    """The slot to free once the transaction has committed: the attempt's, if it is (now) terminal."""
    state = now_in or AttemptStatus(attempt.submit_state)
    return lease_of(attempt, task.tenant_id) if state in ATTEMPT_TERMINAL else None


def _reduce(
    conn: Connection,
    attempt: Any,
    task: Any,
    obs: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float,
    moved: dict[str, AttemptStatus],
    seen: bool | None = None,
) -> str:
    source = EventSource(obs["source"])
    if seen is None:
        seen = (
            conn.execute(
                sa.select(task_state_events.c.id).where(
                    task_state_events.c.source == source.value, task_state_events.c.source_event_id == obs["dedup_key"]
                )
            ).first()
            is not None
        )
    if seen:
        return "duplicate"
    status = JobStatus(obs["status"])
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
        _record(conn, task, status, StateEventOutcome.STALE, base, "older than the newest applied observation")
        return "stale"
    if status is JobStatus.SUCCEEDED and int(task.current_attempt_no) != int(attempt.attempt_no):
        # a success of a superseded attempt: a second paid job exists (ambiguous submit resubmitted)
        _record(conn, task, status, StateEventOutcome.ANOMALY, base, "success of a superseded attempt")
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
    event = task_event_for(status, task.status)
    if event is None:  # queued / throttled: nothing to decide, but progress is worth showing
        _progress_only(conn, task, obs.get("progress"), now)
        _record(conn, task, status, StateEventOutcome.DUPLICATE, base, f"{status.value}: no task transition")
        return "no-op"
    result = decide(tasks.snapshot(task), Trigger(event, progress=obs.get("progress")), now)
    if isinstance(result, Rejection):
        outcome = StateEventOutcome.ANOMALY if result.anomaly else _OUTCOME[result.kind]
        _record(conn, task, status, outcome, base, result.reason, event_type=event.value)
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
    _apply(conn, task, attempt, result, obs, base, now, urgent_fetch_s)
    return f"applied:{result.to_status.value}"


def _bind_ambiguous(conn: Connection, obs: dict[str, Any], now: datetime) -> Any:
    """A status for an unknown job id that carries the request key of one of our ambiguous submits is the proof a
    lookup would have given (seed §4.8.4): the job exists. Bind it, move SUBMIT_UNKNOWN → SUBMITTED, and let the
    observation apply. Without this, a vendor without lookup would leave such a task parked while it is billed."""
    key = obs.get("request_key")
    if not key:
        return None
    a = task_attempts.c
    found = conn.execute(
        sa.select(a.id).where(
            a.provider == obs["provider"], a.provider_request_key == key, a.submit_state == AttemptStatus.UNKNOWN.value
        )
    ).first()
    if found is None:
        return None
    attempt = attempts.read(conn, found.id, lock=True)
    attempts.transition(
        conn, attempt, AttemptEvent.PROVIDER_JOB_FOUND, now, provider_job_id=obs["job_id"], next_poll_at=now
    )
    task = tasks.read(conn, attempt.task_id, lock=True)
    if task.status == TaskStatus.SUBMIT_UNKNOWN.value:
        tasks.decide_and_apply(
            conn,
            task,
            TaskEvent.PROVIDER_JOB_FOUND,
            now,
            source=EventSource(obs["source"]),
            payload={"job_id": obs["job_id"], "via": "request key in a provider status"},
            extra={"next_action_at": None, "parked_reason": None},
        )
    return attempts.read(conn, attempt.id)


def _move_attempt(
    conn: Connection,
    attempt: Any,
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
    try:
        if event is not None:
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.ABORTED, JobStatus.CANCELED):
                values["completed_at"] = now
            if status is not JobStatus.SUCCEEDED and obs.get("error_code"):
                values["provider_error_code"] = str(obs["error_code"])[:128]
            moved["to"] = attempts.transition(conn, attempt, event, now, **values).to_status
            return
    except attempts.AttemptConflict:
        pass  # a late or repeated status for the attempt: its own state already says more
    if values:
        attempts.update(conn, attempt.id, **values)


def _apply(
    conn: Connection,
    task: Any,
    attempt: Any,
    decision: Decision,
    obs: dict[str, Any],
    base: dict[str, Any],
    now: datetime,
    urgent_fetch_s: float,
) -> None:
    extra: dict[str, Any] = {}
    if decision.from_status in (TaskStatus.SUBMITTED, TaskStatus.DISPATCHING) and task.started_at is None:
        extra["started_at"] = now
    if decision.event in (TaskEvent.FINAL_FAILURE, TaskEvent.RETRYABLE_FAILURE):
        extra["last_error_class"] = "provider_failed"
        extra["last_error_code"] = (obs.get("error_code") or obs["status"])[:128]
    if decision.event is TaskEvent.RETRYABLE_FAILURE:
        extra["next_retry_at"] = now
        extra["next_action_at"] = now
    tasks.apply(
        conn,
        task.id,
        decision,
        source=base["source"],
        source_event_id=base["source_event_id"],
        now=now,
        extra=extra,
        payload=base["payload"],
    )
    failpoint("reducer.after_cas")
    if Effect.REQUEST_OUTPUT_FETCH in decision.effects:
        expiries = [_ts(o.get("expires_at")) for o in obs.get("outputs", [])]
        outbox.add(
            conn,
            EventType.FETCH_REQUESTED,
            aggregate_type="task",
            aggregate_id=task.id,
            aggregate_version=decision.version,
            tenant_id=task.tenant_id,
            trace_id=task.trace_id,
            now=now,
            route=fetch_route(expiries, now, urgent_fetch_s),
            payload={
                "task_id": str(task.id),
                "attempt_id": str(attempt.id),
                "provider": attempt.provider,
                "job_id": attempt.provider_job_id,
                "outputs": obs.get("outputs", []),
            },
        )
    billing.close_reservation(conn, task, decision, now, reason=decision.event.value, billed=obs.get("billed"))


def _record(
    conn: Connection,
    task: Any,
    status: JobStatus,
    outcome: StateEventOutcome,
    base: dict[str, Any],
    reason: str,
    event_type: str | None = None,
) -> None:
    tasks.record_event(
        conn,
        event_type=event_type or f"provider_{status.value}",
        from_status=task.status,
        to_status=None,
        task_version=int(task.version),
        outcome=outcome,
        **{**base, "payload": {**base["payload"], "reason": reason}},
    )


def _progress_only(conn: Connection, task: Any, progress: Any, now: datetime) -> None:
    if isinstance(progress, int) and 0 <= progress <= 100 and progress > task.progress:
        conn.execute(
            generation_tasks.update().where(generation_tasks.c.id == task.id).values(progress=progress, updated_at=now)
        )


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
    #: the slot of an attempt this event left terminal, to free now that the transaction has committed
    finished_lease: Lease | None = None
    #: False for a duplicate whose attempt was not read: the caller checks the slot from the rows itself
    slot_checked: bool = False


def reduce_event(engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float = 900) -> Outcome:
    """Consume one `provider.status.observed` event exactly once in effect."""
    return reduce_observation(engine, envelope, now, urgent_fetch_s).outcome


def reduce_observation(engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float = 900) -> Reduced:
    if engine.dialect.name == "postgresql":
        return _reduce_pg(engine, envelope, now, urgent_fetch_s)
    after: dict[str, Any] = {}
    outcome = consume_once(
        engine,
        CONSUMER_GROUP,
        envelope.event_id,
        envelope.aggregate_id,
        lambda conn: reduce(conn, envelope.payload, now, urgent_fetch_s, after),
        now,
    )
    return Reduced(outcome, after.get("lease") if outcome == PROCESSED else None, slot_checked=outcome == PROCESSED)


def attempt_of(engine: Engine, obs: dict[str, Any]) -> Any:
    """The attempt an observation is about (None while it is an orphan)."""
    with engine.connect() as conn:
        row = attempts.by_job(conn, obs["provider"], obs["job_id"])
    return None if row is None else row.id


def _reduce_pg(engine: Engine, envelope: Envelope, now: datetime, urgent_fetch_s: float) -> Reduced:
    """`consume_once` + `reduce` in as few round trips as the protocol allows: BEGIN with the four reads, the
    writes, then the inbox digest with COMMIT — 6 for a new RUNNING observation, 2 for a duplicate delivery
    (research/performance_profile.md counted 22 and 13 at the actor)."""
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
                lease = _finished_lease(got.attempt, got.task) if got.attempt is not None else None
                return Reduced(DUPLICATE, lease, slot_checked=True)
            lease = None
            if got.attempt is None:  # an orphan, or bound by request key: the general path
                after: dict[str, Any] = {}
                digest = reduce(conn, obs, now, urgent_fetch_s, after)
                lease = after.get("lease")
            else:
                moved: dict[str, AttemptStatus] = {}
                digest = _reduce(conn, got.attempt, got.task, obs, now, urgent_fetch_s, moved, seen=got.seen)
                lease = _finished_lease(got.attempt, got.task, moved.get("to"))
            failpoint("consume.before_commit")
            observing.commit(raw, group=CONSUMER_GROUP, event_id=envelope.event_id, digest=digest)
        wakeup.flush_noted(engine, conn)
    return Reduced(PROCESSED, lease, slot_checked=True)
