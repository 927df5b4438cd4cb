"""The reducer's special cases (`services/reducer.py`), each on rows the reducer has already locked: binding an
ambiguous submit by the request key a status carries, a bill or a refund the vendor reports after the task
closed, and the record of an observation that is not applied."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from aivedio_engine.db import attempts, tasks
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.domain.status import TASK_TERMINAL, AttemptStatus, EventSource, StateEventOutcome, TaskStatus
from aivedio_engine.domain.transitions import AttemptEvent, TaskEvent
from aivedio_engine.providers.base import JobStatus
from aivedio_engine.services import billing, late_jobs, observations
from aivedio_engine.services.after_commit import AfterCommit
from aivedio_engine.services.transition import (
    AttemptMove,
    Change,
    decide_and_execute,
    lock_existing_attempt,
    move_attempt,
)


def bind_ambiguous(conn: Connection, obs: dict[str, Any], now: datetime, after: AfterCommit) -> tuple[Any, Any]:
    """A status for an unknown job id that carries the request key of one of our ambiguous submits is the proof a
    lookup would have given: the job exists. Bind it, move SUBMIT_UNKNOWN → SUBMITTED, and let the
    observation apply. Without this, a vendor without lookup would leave such a task parked while it is billed."""
    key = obs.get("request_key")
    if not key:
        return None, None
    found = attempts.unknown_by_request_key(conn, obs["provider"], key)
    if found is None:
        return None, None
    task, attempt = lock_existing_attempt(conn, found)
    if attempt.submit_state != AttemptStatus.UNKNOWN.value:
        return None, None  # resolved meanwhile: an orphan now, rematched from the job id it was bound to
    move = AttemptMove(
        attempt, AttemptEvent.PROVIDER_JOB_FOUND, {"provider_job_id": obs["job_id"], "next_poll_at": now}
    )
    if task.status == TaskStatus.SUBMIT_UNKNOWN.value:
        change = Change(
            EventSource(obs["source"]),
            payload={"job_id": obs["job_id"], "via": "request key in a provider status"},
            columns={"next_action_at": None, "parked_reason": None},
            attempt=move,
        )
        decide_and_execute(conn, task, TaskEvent.PROVIDER_JOB_FOUND, change, now, after)
    else:
        move_attempt(conn, attempt, move.event, now, tenant_id=task.tenant_id, after=after, **move.values)
    # other observations of this job that arrived before it was bound: to the reducer, after this one
    observations.rematch(conn, obs["provider"], obs["job_id"], attempt.id, now)
    return tasks.read(conn, task.id), attempts.read(conn, attempt.id)


def bind_closed(conn: Connection, obs: dict[str, Any], now: datetime) -> tuple[Any, Any]:
    """A status for an unknown job id that carries the request key of an attempt closed as never created: the
    vendor made a job for it after all (a send that left late). Recorded as a duplicate on that attempt
    (`late_jobs.record`, which also asks for the job's cancel), whose further statuses are then only recorded."""
    key = obs.get("request_key")
    found = attempts.by_request_key(conn, obs["provider"], key) if key else None
    if found is None or found.submit_state != AttemptStatus.FAILED_BEFORE_ACCEPT.value:
        return None, None
    task, attempt = lock_existing_attempt(conn, found.id)
    if not late_jobs.is_closed(attempt):
        return None, None
    late_jobs.record(conn, task, attempt, obs["job_id"], now, how=f"a {obs['source']} status naming its request key")
    return task, attempts.read(conn, attempt.id)


def stale_bill(conn: Connection, task: Task, attempt: Attempt, obs: dict[str, Any], now: datetime) -> str:
    """A closed task's job bill in an observation older than the attempt's newest — typically the job's own
    terminal status after the cancel call confirmed the cancel at our time. The bill is the vendor's fact however
    late: kept when the attempt has no billed units yet (a verdict alone may be ours, from the cancel call), and
    the difference settled. Never overwrites billed units."""
    values = attempts.bill_values(obs)
    values.pop("vendor_refunded", None)  # a refund is always a newer fact than the charge it reverses
    if (
        not values
        or TaskStatus(task.status) not in TASK_TERMINAL
        or int(attempt.attempt_no) != int(task.current_attempt_no or 0)
        or attempt.billed_seconds is not None
        or attempt.billed_outputs is not None
    ):
        return ""
    attempts.update(conn, attempt.id, **values)
    back = billing.settle_late_bill(conn, task, now, attempt_id=attempt.id)
    return f"; its bill was recorded (REFUND +{back})" if back > 0 else "; its bill was recorded"


def late_refund(
    conn: Connection, task: Task, attempt: Attempt, status: JobStatus, base: dict[str, Any], now: datetime
) -> str:
    """The vendor gave back what it charged for a job of a closed task (it voided the job, or its moderation
    failed it after the fact): a REFUND row for the job the tenant paid for — once, by its business key."""
    booked = Decimal(0)
    if int(attempt.attempt_no) == int(task.current_attempt_no or 0):
        booked = billing.refund(
            conn,
            task,
            now,
            business_key=billing.refund_key(task.id, attempt.id),
            reason=f"the vendor refunded job {attempt.provider_job_id} after the task ended",
            attempt_id=attempt.id,
        )
    what = f"vendor refund: REFUND +{booked}" if booked > 0 else "vendor refund: nothing charged to refund"
    record(conn, task, status, StateEventOutcome.DUPLICATE, base, what)
    return "refunded" if booked > 0 else "no-op"


def record(
    conn: Connection,
    task: Task,
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
