"""What the database says about the engine right now: the facts behind the metrics, the overview and the alert rules.

Each read is an aggregate answerable from an index: the partial indexes of `db/tables.py` (unfinished tasks,
in-flight attempts, pending outbox rows, orphan events, open alerts, dead letters), the newest storage scan
(`ix_storage_scans_finished_at`), or the time-ordered UUIDv7 primary keys for "created in the last N seconds"
(`id_floor`), since no table has an index on its timestamps.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import (
    alerts,
    dead_letters,
    generation_tasks,
    outbox_events,
    provider_events,
    storage_scans,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.status import (
    ATTEMPT_IN_FLIGHT,
    TASK_TERMINAL,
    AlertStatus,
    AttemptStatus,
    EventSource,
    OutboxStatus,
    TaskStatus,
)

_t, _a, _e = generation_tasks.c, task_attempts.c, task_state_events.c
#: spelled like the partial indexes' predicates (definition order), so the planner can use them
TERMINAL = [s.value for s in TaskStatus if s in TASK_TERMINAL]
IN_FLIGHT = [s.value for s in AttemptStatus if s in ATTEMPT_IN_FLIGHT]
#: at most this many recent callback events are sampled for the lag percentile
LAG_SAMPLE = 1000


def id_floor(at: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond `at`: `id >= id_floor(t)` selects rows created since `t` from the
    primary key index alone (ids come from the wall clock, see `clock.new_id`)."""
    ms = max(0, int(at.timestamp() * 1000))
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62))


def since_floor(now: datetime, seconds: float) -> tuple[datetime, uuid.UUID]:
    """(created_at lower bound by the engine clock, id lower bound by the wall clock that minted the ids).

    Both bounds apply: the id bound prunes the index scan, the created_at bound is the window. The earlier of the
    two clocks is used for the ids, so an engine clock ahead of the wall clock (tests) never hides rows.
    """
    since = now - timedelta(seconds=seconds)
    wall = min(now, datetime.now(UTC)) - timedelta(seconds=seconds)
    return since, id_floor(wall)


@dataclass(frozen=True, slots=True)
class ScanFigures:
    """The newest completed orphan scan (`storage_scans`)."""

    finished_at: datetime
    objects: int
    bytes: int
    orphans: int
    orphan_bytes: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape read from the database."""

    tasks: dict[tuple[str, str], int] = field(default_factory=dict)  # (status, provider or "") → count
    queue_oldest: datetime | None = None
    queue_p95: datetime | None = None  # created_at of the task at the 95th percentile of waiting time
    reserved_credits: float = 0.0
    reserved_oldest: datetime | None = None
    attempts: dict[tuple[str, str], int] = field(default_factory=dict)  # (provider, submit_state) → count
    expiry_risk: dict[str, int] = field(default_factory=dict)
    outbox_due: int = 0
    outbox_oldest: datetime | None = None
    orphans: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    open_alerts: dict[tuple[str, str], int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    callback_lags: list[float] = field(default_factory=list)
    submissions: int = 0
    #: None before the first completed scan
    storage_scan: ScanFigures | None = None


def read_snapshot(conn: Connection, now: datetime, *, window_s: float, urgent_within_s: float) -> Snapshot:
    """`window_s`: how far back "recent" reaches (`metrics.window_s`); `urgent_within_s`: how soon an output URL
    must expire to count as at risk (`fetch.urgent_within_s`)."""
    active = (
        sa.select(
            _t.status,
            _t.selected_provider,
            sa.func.count(),
            sa.func.sum(_t.reserved_amount),
            sa.func.min(_t.created_at),
            sa.func.min(sa.case((_t.reserved_amount > 0, _t.created_at))),
        )
        .where(_t.status.not_in(TERMINAL))
        .group_by(_t.status, _t.selected_provider)
    )
    tasks: dict[tuple[str, str], int] = {}
    reserved_credits = 0.0
    queue_oldest: datetime | None = None
    reserved_oldest = []
    for status, provider, n, reserved, oldest, reserved_at in conn.execute(active):
        tasks[(status, provider or "")] = int(n)
        reserved_credits += float(reserved or 0)
        if reserved_at is not None:
            reserved_oldest.append(reserved_at)
        if status == TaskStatus.QUEUED.value:
            queue_oldest = min(filter(None, (queue_oldest, oldest)))
    queued = sum(n for (status, _), n in tasks.items() if status == TaskStatus.QUEUED.value)
    queue_p95 = None
    if queued:
        queue_p95 = conn.execute(
            sa.select(_t.created_at)
            .where(_t.status == TaskStatus.QUEUED.value)
            .order_by(_t.created_at)
            .offset(int(queued * 0.05))
            .limit(1)
        ).scalar()
    attempts = {
        (provider, state): int(n)
        for provider, state, n in conn.execute(
            sa.select(_a.provider, _a.submit_state, sa.func.count())
            .where(_a.submit_state.in_(IN_FLIGHT))
            .group_by(_a.provider, _a.submit_state)
        )
    }
    horizon = now + timedelta(seconds=urgent_within_s)
    current = task_attempts.join(generation_tasks, sa.and_(_t.id == _a.task_id, _t.current_attempt_no == _a.attempt_no))
    expiry_risk = {
        p: int(n)
        for p, n in conn.execute(
            sa.select(_a.provider, sa.func.count())
            .select_from(current)
            .where(
                _t.status.not_in(TERMINAL),
                _t.status == TaskStatus.OUTPUT_FETCHING.value,
                _a.output_url_expires_at <= horizon,
            )
            .group_by(_a.provider)
        )
    }
    o = outbox_events.c
    outbox_due, outbox_oldest = conn.execute(
        sa.select(sa.func.count(), sa.func.min(o.available_at)).where(
            o.status == OutboxStatus.PENDING.value, o.available_at <= now
        )
    ).one()
    pe = provider_events.c
    orphans = {
        p: int(n)
        for p, n in conn.execute(sa.select(pe.provider, sa.func.count()).where(pe.orphan).group_by(pe.provider))
    }
    dead = conn.execute(
        sa.select(sa.func.count()).select_from(dead_letters).where(dead_letters.c.replayed_at.is_(None))
    ).scalar_one()
    open_alerts = {
        (r, sev): int(n)
        for r, sev, n in conn.execute(
            sa.select(alerts.c.rule, alerts.c.severity, sa.func.count())
            .where(alerts.c.status == AlertStatus.OPEN.value)
            .group_by(alerts.c.rule, alerts.c.severity)
        )
    }
    since, floor = since_floor(now, window_s)
    outcomes = {
        outcome: int(n)
        for outcome, n in conn.execute(
            sa.select(_e.outcome, sa.func.count()).where(_e.id >= floor, _e.created_at >= since).group_by(_e.outcome)
        )
    }
    callback_lags = [
        max(0.0, (observed - provider).total_seconds())
        for observed, provider in conn.execute(
            sa.select(_e.observed_at, _e.provider_updated_at)
            .where(
                _e.id >= floor,
                _e.created_at >= since,
                _e.source == EventSource.CALLBACK.value,
                _e.provider_updated_at.is_not(None),
            )
            .order_by(_e.id.desc())
            .limit(LAG_SAMPLE)
        )
    ]
    submissions = conn.execute(
        sa.select(sa.func.count()).select_from(generation_tasks).where(_t.id >= floor, _t.created_at >= since)
    ).scalar_one()
    sc = storage_scans.c  # a failed scan's zeros mean nothing: the figures stay those of the last good one
    scan = conn.execute(
        sa.select(sc.finished_at, sc.objects, sc.bytes, sc.orphans, sc.orphan_bytes)
        .where(sc.error.is_(None))
        .order_by(sc.finished_at.desc())
        .limit(1)
    ).first()
    return Snapshot(
        tasks=tasks,
        queue_oldest=queue_oldest,
        queue_p95=queue_p95,
        reserved_credits=reserved_credits,
        reserved_oldest=min(reserved_oldest, default=None),
        attempts=attempts,
        expiry_risk=expiry_risk,
        outbox_due=outbox_due,
        outbox_oldest=outbox_oldest,
        orphans=orphans,
        dead_letters=dead,
        open_alerts=open_alerts,
        outcomes=outcomes,
        callback_lags=callback_lags,
        submissions=submissions,
        storage_scan=None if scan is None else ScanFigures(*scan),
    )
