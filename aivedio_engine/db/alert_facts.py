"""The System A facts the threshold alert rules read (`observability.alert_rules.gather`): windowed counts over the
state events and the ledger, bounded by `snapshot.since_floor` so the primary key index answers them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.snapshot import TERMINAL, since_floor
from aivedio_engine.db.tables import credit_ledger, generation_tasks, task_attempts, task_state_events
from aivedio_engine.domain.status import AttemptStatus, LedgerEntryType, StateEventOutcome, TaskStatus

_t, _a, _e, _l = generation_tasks.c, task_attempts.c, task_state_events.c, credit_ledger.c
FAILED = (TaskStatus.FAILED_FINAL.value, TaskStatus.EXPIRED.value)
FINISHED_ATTEMPT = (AttemptStatus.SUCCEEDED.value, AttemptStatus.FAILED.value, AttemptStatus.FAILED_BEFORE_ACCEPT.value)
#: how media processing words a hold for a human after it failed (services.media._retry_or_escalate)
MEDIA_HOLD_PREFIX = "media processing failed"
#: ledger entries that commit or give back credits (manual adjustments are an operator's, not usage)
SPEND_ENTRIES = (
    LedgerEntryType.RESERVE.value,
    LedgerEntryType.SETTLE.value,
    LedgerEntryType.RELEASE.value,
    LedgerEntryType.REFUND.value,
)
HOUR = timedelta(hours=1)
BASELINE_HOURS = 24


@dataclass(frozen=True, slots=True)
class MediaEnds:
    """How many tasks left POST_PROCESSING for one status within the window."""

    to_status: str
    count: int
    #: of those, the ones held for a human because media processing failed
    held_for_failure: int


@dataclass(frozen=True)
class Spend:
    tenant_id: str
    project_id: str | None
    last_hour: Decimal
    baseline_per_hour: Decimal  # mean of the BASELINE_HOURS hours before the last one


def _recent(since: datetime, floor: uuid.UUID) -> sa.ColumnElement[bool]:
    return sa.and_(_e.id >= floor, _e.created_at >= since, _e.outcome == StateEventOutcome.APPLIED.value)


def failed_tasks_since(conn: Connection, since: datetime, floor: uuid.UUID) -> int:
    """Tasks that reached FAILED_FINAL or EXPIRED within the window (each counted once)."""
    failed: int = conn.execute(
        sa.select(sa.func.count(sa.distinct(_e.task_id))).where(_recent(since, floor), _e.to_status.in_(FAILED))
    ).scalar_one()
    return failed


def media_ends_since(conn: Connection, since: datetime, floor: uuid.UUID) -> list[MediaEnds]:
    reason = _e.payload["reason"].as_string()
    held_for_failure = sa.case((reason.like(MEDIA_HOLD_PREFIX + "%"), 1), else_=0)
    return [
        MediaEnds(to_status, int(n), int(held or 0))
        for to_status, n, held in conn.execute(
            sa.select(_e.to_status, sa.func.count(), sa.func.sum(held_for_failure))
            .where(_recent(since, floor), _e.from_status == TaskStatus.POST_PROCESSING.value)
            .group_by(_e.to_status)
        )
    ]


def queued_tasks(conn: Connection) -> tuple[int, datetime | None]:
    """(QUEUED tasks, created_at of the oldest)."""
    depth, oldest = conn.execute(
        sa.select(sa.func.count(), sa.func.min(_t.created_at)).where(
            _t.status.not_in(TERMINAL), _t.status == TaskStatus.QUEUED.value
        )
    ).one()
    return int(depth), oldest


def newest_finished_attempts(conn: Connection, provider: str, floor: uuid.UUID, limit: int) -> list[str]:
    """The submit states of `provider`'s newest `limit` finished attempts created since `floor`, newest first."""
    return list(
        conn.execute(
            sa.select(_a.submit_state)
            .where(_a.id >= floor, _a.provider == provider, _a.submit_state.in_(FINISHED_ATTEMPT))
            .order_by(_a.id.desc())
            .limit(limit)
        )
        .scalars()
        .all()
    )


def spend(conn: Connection, now: datetime) -> list[Spend]:
    """Credits committed per project (per tenant for tasks without one): in the last hour, and the hourly mean of
    the BASELINE_HOURS hours before."""
    hour_ago = now - HOUR
    since, floor = since_floor(now, (BASELINE_HOURS + 1) * HOUR.total_seconds())
    recent = sa.case((_l.created_at >= hour_ago, _l.amount), else_=0)
    before = sa.case((_l.created_at < hour_ago, _l.amount), else_=0)
    rows = conn.execute(
        sa.select(_l.tenant_id, _t.project_id, sa.func.sum(recent), sa.func.sum(before))
        .select_from(credit_ledger.outerjoin(generation_tasks, _t.id == _l.task_id))
        .where(_l.id >= floor, _l.created_at >= since, _l.entry_type.in_(SPEND_ENTRIES))
        .group_by(_l.tenant_id, _t.project_id)
    )
    # ledger amounts are signed from the tenant's side: a reservation is negative, so spend is the negated sum
    return [
        Spend(
            str(tenant),
            str(project) if project else None,
            -Decimal(last or 0),
            max(Decimal(0), -Decimal(earlier or 0)) / BASELINE_HOURS,
        )
        for tenant, project, last, earlier in rows
    ]
