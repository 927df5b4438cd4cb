"""Alerts raised by the engine itself (anomalies, cost risks, parked tasks), deduplicated while open."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import alerts, generation_tasks
from aivedio_engine.domain.status import TASK_TERMINAL, AlertSeverity, AlertStatus

_al = alerts.c
_t = generation_tasks.c


class Rule(StrEnum):
    """Alert rules the engine raises from its own decisions."""

    LATE_EVENT_AFTER_TERMINAL = "late_event_after_terminal"  # e.g. success after CANCELED: orphan product
    SUBMIT_UNKNOWN_PARKED = "submit_unknown_parked"  # reconciliation window passed without an answer
    RESUBMIT_WITHOUT_LOOKUP = "resubmit_without_lookup"  # cost risk: a duplicate paid job is possible
    #: cost risk: listing the vendor's jobs found several that match the request; which one is ours is unknown
    AMBIGUOUS_LIST_MATCH = "ambiguous_list_match"
    DUPLICATE_PROVIDER_JOB = "duplicate_provider_job"
    #: cost risk: a vendor job turned up for an attempt closed as never created (a send that left late)
    DUPLICATE_PAID_JOB = "duplicate_paid_job"
    ORPHAN_CALLBACK_EXPIRED = "orphan_callback_expired"
    #: a job's queries kept failing past `[retry.query]`; it is still polled, slowly
    QUERY_BUDGET_SPENT = "query_budget_spent"
    #: a stored raw output differs from what the provider serves now; both are kept, nothing is overwritten
    OUTPUT_CHECKSUM_MISMATCH = "output_checksum_mismatch"
    OUTPUT_FETCH_FAILED = "output_fetch_failed"  # the provider's output could not be brought home
    MEDIA_FAILED = "media_failed"  # the output was stored but could not be made playable
    #: our object store failed under the fetch or media step: tasks are held, not failed (services/store_outage.py)
    STORAGE_UNAVAILABLE = "storage_unavailable"
    #: the vendor billed more than the task's reservation: recorded, never charged past it (domain/settlement.py)
    VENDOR_BILL_OVER_RESERVATION = "vendor_bill_over_reservation"
    #: the vendor billed for something the tenant was not charged for (nothing or not every output delivered, a
    #: duplicate job): the platform bears it (services/billing.py `book_platform_cost`)
    PLATFORM_COST = "platform_cost"
    #: the workers gave up on a message that tells a client about its task (`domain.events.NOTIFICATION_ACTORS`):
    #: a webhook or a workflow step waits on `aivedio replay dlq`
    NOTIFICATION_DEAD_LETTERED = "notification_dead_lettered"
    #: a task held in MANUAL_REVIEW is past 80 % of its review SLA (`[review] sla_s`) without a verdict
    REVIEW_SLA_NEAR = "review_sla_near"
    # threshold rules over live data, evaluated by observability.alert_rules
    FAILED_TASKS_HIGH = "failed_tasks_high"
    PROVIDER_CONSECUTIVE_FAILURES = "provider_consecutive_failures"
    QUEUE_BACKLOG = "queue_backlog"
    MEDIA_FAILURE_RATE = "media_failure_rate"
    COST_ANOMALY = "cost_anomaly"
    STORAGE_CAPACITY_LOW = "storage_capacity_low"
    # System B: workflow steps; queue backlog and cost anomaly reuse the rules above
    FAILED_STEPS_HIGH = "failed_steps_high"
    COMPOSITION_FAILURE_RATE = "composition_failure_rate"
    #: a required role (relay, worker, scheduler, sweeper) has not been seen alive while work waits for it
    ROLE_MISSING = "role_missing"
    #: a provider's callbacks failed verification past `[alerts] callback_verify_failures` in one window
    CALLBACK_VERIFY_FAILURES = "callback_verify_failures"
    # motion invariants (issue 14, services.invariants_motion): what the sweeper's repair did not fix in time
    ATTEMPT_OPEN_AFTER_TASK_ENDED = "attempt_open_after_task_ended"
    TASK_NOT_MOVING = "task_not_moving"
    SLOT_HELD_NOT_IN_FLIGHT = "slot_held_not_in_flight"
    OBSERVATION_UNAPPLIED = "observation_unapplied"


def raise_alert(
    conn: Connection,
    rule: Rule,
    severity: AlertSeverity,
    *,
    dedup_key: str,
    message: str,
    now: datetime,
    subject_type: str | None = None,
    subject_id: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Open an alert, or bump `last_seen_at` of the open one with the same rule and dedup key."""
    insert = dialect_insert(conn)
    stmt = insert(alerts).values(
        id=new_id(),
        rule=rule.value,
        severity=severity.value,
        status=AlertStatus.OPEN.value,
        subject_type=subject_type,
        subject_id=subject_id,
        dedup_key=dedup_key,
        message=message[:2000],
        details=details,
        raised_at=now,
        last_seen_at=now,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[alerts.c.rule, alerts.c.dedup_key],
        index_where=alerts.c.status != AlertStatus.RESOLVED.value,
        set_={"last_seen_at": now},
    )
    conn.execute(stmt)


def resolve_open(conn: Connection, rule: Rule, dedup_keys: Sequence[str], *, now: datetime) -> int:
    """Resolve the unresolved (OPEN or ACKNOWLEDGED) alerts of `rule` with these dedup keys: for a condition the
    engine itself sees end. Returns how many it closed."""
    if not dedup_keys:
        return 0
    result = conn.execute(
        alerts.update()
        .where(_al.rule == rule.value, _al.dedup_key.in_(list(dedup_keys)), _al.status != AlertStatus.RESOLVED.value)
        .values(status=AlertStatus.RESOLVED.value, resolved_at=now)
    )
    return result.rowcount


def note(conn: Connection, rule: Rule, dedup_key: str, *, details: dict[str, Any], message: str, now: datetime) -> bool:
    """Add to the newest alert of `rule` with `dedup_key` (resolved or not: a fact learnt after an operator closed
    it still belongs on it): `details` merged into its details, `message` appended. False when there is none."""
    row = conn.execute(
        sa.select(_al.id, _al.details, _al.message)
        .where(_al.rule == rule.value, _al.dedup_key == dedup_key)
        .order_by(_al.raised_at.desc())
        .limit(1)
        .with_for_update()
    ).first()
    if row is None:
        return False
    conn.execute(
        alerts.update()
        .where(_al.id == row.id)
        .values(details={**(row.details or {}), **details}, message=(row.message + message)[:2000], last_seen_at=now)
    )
    return True


def open_alerts(conn: Connection, rule: Rule | None = None) -> list[AlertView]:
    """The OPEN alerts (of one rule), oldest first."""
    stmt = sa.select(alerts).where(alerts.c.status == AlertStatus.OPEN.value)
    if rule is not None:
        stmt = stmt.where(alerts.c.rule == rule.value)
    return [_view(r) for r in conn.execute(stmt.order_by(alerts.c.raised_at))]


@dataclass(frozen=True)
class AlertView:
    id: uuid.UUID
    rule: str
    severity: str
    status: str
    subject_type: str | None
    subject_id: str | None
    message: str
    raised_at: datetime
    last_seen_at: datetime
    acknowledged_by: str | None
    acknowledged_at: datetime | None
    resolved_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        def when(t: datetime | None) -> str | None:
            return t.isoformat() if t else None

        return {
            "id": str(self.id),
            "rule": self.rule,
            "severity": self.severity,
            "status": self.status,
            "subject_type": self.subject_type,
            "subject_id": self.subject_id,
            "message": self.message,
            "raised_at": when(self.raised_at),
            "last_seen_at": when(self.last_seen_at),
            "acknowledged_by": self.acknowledged_by,
            "acknowledged_at": when(self.acknowledged_at),
            "resolved_at": when(self.resolved_at),
        }


@dataclass(frozen=True, slots=True)
class AlertState:
    """What a status change needs of an alert it has locked."""

    id: uuid.UUID
    status: str
    subject_type: str | None
    subject_id: str | None


def find(
    engine: Engine, statuses: Sequence[str], rule: str | None, severity: str | None, *, limit: int
) -> list[AlertView]:
    """The alerts in `statuses` (of one rule, one severity), newest first."""
    stmt = sa.select(alerts).where(*_matching(statuses, rule, severity))
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(_al.raised_at.desc(), _al.id.desc()).limit(limit)).all()
    return [_view(r) for r in rows]


def count(engine: Engine, statuses: Sequence[str], rule: str | None, severity: str | None) -> int:
    stmt = sa.select(sa.func.count()).select_from(alerts).where(*_matching(statuses, rule, severity))
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def lock_states(conn: Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, AlertState]:
    """The named alerts that exist, locked (FOR UPDATE) for a status change."""
    rows = conn.execute(
        sa.select(_al.id, _al.status, _al.subject_type, _al.subject_id).where(_al.id.in_(ids)).with_for_update()
    )
    return {r.id: AlertState(r.id, r.status, r.subject_type, r.subject_id) for r in rows}


def set_status(conn: Connection, ids: Sequence[uuid.UUID], *, allowed: Sequence[str], values: dict[str, Any]) -> None:
    """Move the alerts among `ids` still in an `allowed` status: `values` holds the new status and its stamps."""
    conn.execute(alerts.update().where(_al.id.in_(ids), _al.status.in_(allowed)).values(**values))


def parked_unfinished(conn: Connection, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """task id → parked reason, for the tasks among `task_ids` that are parked and not finished."""
    parked = conn.execute(
        sa.select(_t.id, _t.parked_reason).where(
            _t.id.in_(task_ids), _t.parked_reason.is_not(None), _t.status.not_in([s.value for s in TASK_TERMINAL])
        )
    )
    return {r.id: r.parked_reason for r in parked}


def _matching(statuses: Sequence[str], rule: str | None, severity: str | None) -> list[Any]:
    where: list[Any] = [_al.status.in_(statuses)]
    if rule:
        where.append(_al.rule == rule)
    if severity:
        where.append(_al.severity == severity)
    return where


def _view(r: Any) -> AlertView:
    return AlertView(
        r.id,
        r.rule,
        r.severity,
        r.status,
        r.subject_type,
        r.subject_id,
        r.message,
        r.raised_at,
        r.last_seen_at,
        r.acknowledged_by,
        r.acknowledged_at,
        r.resolved_at,
    )
