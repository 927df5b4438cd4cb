"""Reads of what the providers' capacity is doing: the recent attempt outcomes that feed each provider's breaker
and throttle (services.provider_health), and the window aggregates of `aivedio capacity live`
(services.capacity_live)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement, Connection

from aivedio_engine.db.tables import assets, generation_tasks, task_attempts, task_state_events
from aivedio_engine.domain.status import (
    ATTEMPT_IN_FLIGHT,
    TASK_TERMINAL,
    AssetKind,
    AttemptStatus,
    StateEventOutcome,
    TaskStatus,
)

_t, _a, _e, _as = generation_tasks.c, task_attempts.c, task_state_events.c, assets.c
_TERMINAL = [s.value for s in TASK_TERMINAL]
_WAITING = [TaskStatus.QUEUED.value, TaskStatus.RETRY_WAIT.value]
#: an attempt whose submit ended: its outcome feeds the breaker
_DECIDED = [
    s.value
    for s in (
        AttemptStatus.FAILED_BEFORE_ACCEPT,
        AttemptStatus.ACKED,
        AttemptStatus.RUNNING,
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.CANCELED,
        AttemptStatus.UNKNOWN,
    )
]


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """One decided submit of a provider, as its breaker and throttle read it."""

    submit_state: str
    last_error_class: str | None
    provider_error_code: str | None
    updated_at: datetime


def decided_attempts(conn: Connection, provider: str, window: int) -> list[AttemptOutcome]:
    """The provider's last `window` submitted attempts whose submit ended, newest first."""
    rows = conn.execute(
        sa.select(_a.submit_state, _a.last_error_class, _a.provider_error_code, _a.updated_at)
        .where(_a.provider == provider, _a.submit_state.in_(_DECIDED), _a.submitted_at.is_not(None))
        .order_by(_a.updated_at.desc())
        .limit(window)
    ).all()
    return [AttemptOutcome(r.submit_state, r.last_error_class, r.provider_error_code, r.updated_at) for r in rows]


def sending_count(conn: Connection, provider: str) -> int:
    """Attempts handed to the provider whose outcome is not known yet (NEW, SENDING)."""
    n: int = conn.execute(
        sa.select(sa.func.count())
        .select_from(task_attempts)
        .where(_a.provider == provider, _a.submit_state.in_([AttemptStatus.NEW.value, AttemptStatus.SENDING.value]))
    ).scalar_one()
    return n


# `aivedio capacity live`: one aggregate query per figure; durations are averaged in SQL (epoch arithmetic differs
# per dialect), so no row list is ever pulled out. A mean is None where the window holds no sample.


def seconds_between(conn: Connection, start: Any, end: Any) -> ColumnElement[Any]:
    """end − start in seconds, as a SQL expression of this connection's dialect."""
    if conn.dialect.name == "postgresql":
        return sa.func.extract("epoch", end - start)
    # SQLite keeps UTC timestamps as ISO text; julianday() reads them (to ~0.1 ms: enough for capacity)
    return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0


def arrivals_by_provider(conn: Connection, since: datetime, now: datetime) -> dict[str | None, int]:
    """Tasks created in the window, by `selected_provider`."""
    return dict(
        conn.execute(
            sa.select(_t.selected_provider, sa.func.count())
            .where(_in(_t.created_at, since, now))
            .group_by(_t.selected_provider)
        ).all()
    )


def runs_by_provider(conn: Connection, since: datetime, now: datetime) -> dict[str, tuple[float | None, int]]:
    """provider → (mean submit → success seconds, samples) of the attempts that succeeded in the window."""
    return {
        r[0]: (_float(r[1]), int(r[2]))
        for r in conn.execute(
            sa.select(
                _a.provider, sa.func.avg(seconds_between(conn, _a.submitted_at, _a.completed_at)), sa.func.count()
            )
            .where(
                _a.submit_state == AttemptStatus.SUCCEEDED.value,
                _a.submitted_at.is_not(None),
                _in(_a.completed_at, since, now),
            )
            .group_by(_a.provider)
        )
    }


def in_flight_by_provider(conn: Connection) -> dict[str | None, int]:
    """Attempts holding a slot now, by provider."""
    return dict(
        conn.execute(
            sa.select(_a.provider, sa.func.count())
            .where(_a.submit_state.in_([s.value for s in ATTEMPT_IN_FLIGHT]))
            .group_by(_a.provider)
        ).all()
    )


def waiting_by_provider(conn: Connection) -> dict[str | None, int]:
    """Tasks waiting for a slot now (QUEUED, RETRY_WAIT), by `selected_provider`."""
    return dict(
        conn.execute(
            sa.select(_t.selected_provider, sa.func.count())
            .where(_t.status.in_(_WAITING))
            .group_by(_t.selected_provider)
        ).all()
    )


def arrivals(conn: Connection, since: datetime, now: datetime) -> int:
    return int(conn.execute(sa.select(sa.func.count()).where(_in(_t.created_at, since, now))).scalar_one())


def runs(conn: Connection, since: datetime, now: datetime) -> tuple[float | None, int]:
    """(mean submit → success seconds, samples) of all attempts that succeeded in the window."""
    mean, n = conn.execute(
        sa.select(sa.func.avg(seconds_between(conn, _a.submitted_at, _a.completed_at)), sa.func.count()).where(
            _a.submit_state == AttemptStatus.SUCCEEDED.value,
            _a.submitted_at.is_not(None),
            _in(_a.completed_at, since, now),
        )
    ).one()
    return _float(mean), int(n)


def finished(conn: Connection, since: datetime, now: datetime) -> tuple[int, int]:
    """(tasks that reached a terminal state in the window, of them SUCCEEDED)."""
    ok = sa.case((_t.status == TaskStatus.SUCCEEDED.value, 1), else_=0)
    total, succeeded = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ok), 0)).where(
            _t.status.in_(_TERMINAL), _in(_t.finished_at, since, now)
        )
    ).one()
    return int(total), int(succeeded)


def raw_outputs(conn: Connection, since: datetime, now: datetime) -> tuple[float | None, int]:
    """(mean size in bytes, count) of the raw outputs stored in the window."""
    size_mean, outputs = conn.execute(
        sa.select(sa.func.avg(_as.size_bytes), sa.func.count(_as.size_bytes)).where(
            _as.kind == AssetKind.RAW_OUTPUT.value, _in(_as.created_at, since, now)
        )
    ).one()
    return _float(size_mean), int(outputs)


def media(conn: Connection, since: datetime, now: datetime) -> tuple[float | None, int]:
    """Enter POST_PROCESSING (version v) → leave it (version v + 1), for the exits in the window."""
    enter, leave = task_state_events.alias("enter"), task_state_events.alias("leave")
    applied = StateEventOutcome.APPLIED.value
    mean, n = conn.execute(
        sa.select(sa.func.avg(seconds_between(conn, enter.c.observed_at, leave.c.observed_at)), sa.func.count())
        .select_from(
            enter.join(
                leave, sa.and_(leave.c.task_id == enter.c.task_id, leave.c.task_version == enter.c.task_version + 1)
            )
        )
        .where(
            enter.c.outcome == applied,
            leave.c.outcome == applied,
            enter.c.to_status == TaskStatus.POST_PROCESSING.value,
            leave.c.from_status == TaskStatus.POST_PROCESSING.value,
            _in(leave.c.observed_at, since, now),
        )
    ).one()
    return _float(mean), int(n)


def transitions(conn: Connection, since: datetime, now: datetime) -> int:
    """Applied transitions of the tasks finished in the window."""
    return int(
        conn.execute(
            sa.select(sa.func.count())
            .select_from(task_state_events.join(generation_tasks, _t.id == _e.task_id))
            .where(
                _e.outcome == StateEventOutcome.APPLIED.value,
                _e.from_status.is_not(None),
                _t.status.in_(_TERMINAL),
                _in(_t.finished_at, since, now),
            )
        ).scalar_one()
    )


def waiting(conn: Connection) -> int:
    """Tasks waiting for a slot now, all providers."""
    return int(conn.execute(sa.select(sa.func.count()).where(_t.status.in_(_WAITING))).scalar_one())


def _in(col: Any, since: datetime, now: datetime) -> ColumnElement[bool]:
    return sa.and_(col > since, col <= now)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
