"""A vendor job made for an attempt we had already closed as never created: a second paid job, accounted for.

The send deadline and the reconciler's "not created" bound make this rare, but a process frozen in the middle
of its HTTP call (SIGSTOP, a VM pause) can still deliver a request after both. Whoever learns the job id — the
late send's own answer, or a status that carries the attempt's request key — records it here, in the caller's
transaction: the job id on the closed attempt (which stays FAILED_BEFORE_ACCEPT: the task went on without it),
the price-list worth of one job as platform cost, a `duplicate_paid_job` alert, and a `provider.cancel.requested`
message. The task is never moved by it, and nothing is dead-lettered. The reducer holds no adapter, so the
cancel is that message's consumer's (`ProviderSync.cancel_requested`), whichever way the job id was learnt; it
writes what the vendor answered onto the alert (`note_cancel`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from aivedio_engine.db import alerts, attempts
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.domain.status import AlertSeverity, AttemptStatus
from aivedio_engine.services import billing, follow_on

#: the platform-cost kind of such a job: the alert's rule
KIND = alerts.Rule.DUPLICATE_PAID_JOB.value
#: the inbox group of the duplicate's cancel (`ProviderSync.cancel_requested`)
CANCEL_GROUP = "provider_cancel"


def is_closed(attempt: Attempt) -> bool:
    """Closed as never created: a job that turns up for it is a duplicate, never the task's job."""
    return attempt.submit_state == AttemptStatus.FAILED_BEFORE_ACCEPT.value


def record(conn: Connection, task: Task, attempt: Attempt, job_id: str, now: datetime, *, how: str) -> bool:
    """Record `job_id` as a duplicate job of the closed `attempt` (both rows locked by the caller). False when
    it is recorded already (a redelivery), or when the attempt holds another job id (recorded as that one; the
    alert names this one too)."""
    if attempt.provider_job_id == job_id:
        return False
    first = attempt.provider_job_id is None
    if first:
        attempts.update(conn, attempt.id, provider_job_id=job_id, updated_at=now)
    worth = one_job_worth(task)
    why = (
        f"{attempt.provider} job {job_id} was made by attempt #{attempt.attempt_no}'s request after the attempt "
        f"was closed as never created ({how}); the task's outcome is another attempt's"
    )
    booked = first and billing.book_platform_cost(conn, task, worth, now, kind=KIND, why=why, attempt_id=attempt.id)
    alerts.raise_alert(
        conn,
        alerts.Rule.DUPLICATE_PAID_JOB,
        AlertSeverity.CRITICAL,
        dedup_key=dedup_key(attempt.provider, job_id),
        now=now,
        subject_type="task",
        subject_id=str(task.id),
        message=f"second paid job: {why}; {worth} credits' worth booked as platform cost"
        + (", cancel asked" if first else ""),
        details={
            "attempt_id": str(attempt.id),
            "provider": attempt.provider,
            "job_id": job_id,
            "platform_cost": str(worth) if booked else None,
            "cancel": "asked" if first else None,
        },
    )
    if first:
        stop = follow_on.CancelRequested(attempt.id, task.id, attempt.provider, job_id)
        follow_on.emit(conn, task, stop, version=int(task.version), now=now)
    return first


def dedup_key(provider: str, job_id: str) -> str:
    """The `duplicate_paid_job` alert of one job."""
    return f"{provider}:{job_id}"


def note_cancel(conn: Connection, provider: str, job_id: str, outcome: str, now: datetime) -> None:
    """What the vendor answered to the duplicate job's cancel, on its alert: the operator's runbook starts there."""
    alerts.note(
        conn,
        alerts.Rule.DUPLICATE_PAID_JOB,
        dedup_key(provider, job_id),
        details={"cancel": outcome},
        message=f"; cancel at the vendor: {outcome}",
        now=now,
    )


def one_job_worth(task: Task) -> Decimal:
    """What one vendor job of this task is worth at the price list: estimate ÷ n per output, and the late request
    asked for all n outputs, so the whole estimate."""
    return Decimal(task.estimated_cost)


def alert_unknown(conn: Connection, task: Task, attempt: Attempt, now: datetime, *, reason: str) -> None:
    """A late send to a closed attempt whose answer was lost: the vendor may hold a job we cannot name. Only the
    vendor's records (a lookup by the request key, its console, the invoice) can tell."""
    alerts.raise_alert(
        conn,
        alerts.Rule.DUPLICATE_PAID_JOB,
        AlertSeverity.CRITICAL,
        dedup_key=f"{attempt.provider}:{attempt.provider_request_key}",
        now=now,
        subject_type="task",
        subject_id=str(task.id),
        message=(
            f"possible second paid job: attempt #{attempt.attempt_no}'s request reached {attempt.provider} after "
            f"the attempt was closed as never created, and its answer was lost ({reason}); look the request key "
            f"{attempt.provider_request_key} up at the vendor"
        ),
        details={"attempt_id": str(attempt.id), "provider": attempt.provider, "job_id": None},
    )
