"""Alerts raised by the engine itself (anomalies, cost risks, parked tasks), deduplicated while open."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import alerts
from aivedio_engine.domain.status import AlertSeverity, AlertStatus


class Rule(StrEnum):
    """Alert rules the engine raises from its own decisions (seed 000 §4.8, DESIGN §5, §8, §11)."""

    LATE_EVENT_AFTER_TERMINAL = "late_event_after_terminal"  # e.g. success after CANCELED: orphan product
    SUBMIT_UNKNOWN_PARKED = "submit_unknown_parked"  # reconciliation window passed without an answer
    RESUBMIT_WITHOUT_LOOKUP = "resubmit_without_lookup"  # cost risk: a duplicate paid job is possible
    #: cost risk: listing the vendor's jobs found several that match the request; which one is ours is unknown
    AMBIGUOUS_LIST_MATCH = "ambiguous_list_match"
    DUPLICATE_PROVIDER_JOB = "duplicate_provider_job"
    ORPHAN_CALLBACK_EXPIRED = "orphan_callback_expired"
    #: a stored raw output differs from what the provider serves now; both are kept, nothing is overwritten
    OUTPUT_CHECKSUM_MISMATCH = "output_checksum_mismatch"
    OUTPUT_FETCH_FAILED = "output_fetch_failed"  # the provider's output could not be brought home
    MEDIA_FAILED = "media_failed"  # the output was stored but could not be made playable
    # threshold rules over live data (seed 004 §17), evaluated by observability.alert_rules
    FAILED_TASKS_HIGH = "failed_tasks_high"
    PROVIDER_CONSECUTIVE_FAILURES = "provider_consecutive_failures"
    QUEUE_BACKLOG = "queue_backlog"
    MEDIA_FAILURE_RATE = "media_failure_rate"
    COST_ANOMALY = "cost_anomaly"
    STORAGE_CAPACITY_LOW = "storage_capacity_low"


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
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
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


def open_alerts(conn: Connection, rule: Rule | None = None) -> list[Any]:
    stmt = sa.select(alerts).where(alerts.c.status == AlertStatus.OPEN.value)
    if rule is not None:
        stmt = stmt.where(alerts.c.rule == rule.value)
    return list(conn.execute(stmt.order_by(alerts.c.raised_at)))
