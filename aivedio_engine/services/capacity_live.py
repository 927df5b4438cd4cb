"""`aivedio capacity live`: measure the rates of seed 000 §4.10 over a window, then hand them to the pure model.

Every figure is one aggregate query over our own tables, per provider where the model needs it per provider:
- arrivals: tasks created in the window (by `selected_provider`);
- W: mean submit → provider success of attempts that succeeded in the window (`completed_at − submitted_at`);
- success rate: SUCCEEDED among the tasks that reached a terminal state in the window;
- output size: mean `size_bytes` of the raw outputs stored in the window;
- media time: mean time from entering POST_PROCESSING to leaving it, for exits in the window (task history);
- transitions per task: applied transitions of the tasks finished in the window, per task;
- in flight / backlog: attempts holding a slot now, tasks waiting for one now.
Durations are averaged in SQL (epoch arithmetic differs per dialect), so no row list is ever pulled out.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement, Connection, Engine

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db.tables import assets, generation_tasks, task_attempts, task_state_events
from aivedio_engine.domain.capacity_live import LiveReport, Measured, SlotLimits, assess
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


def seconds_between(conn: Connection, start: Any, end: Any) -> ColumnElement[Any]:
    """end − start in seconds, as a SQL expression of this connection's dialect."""
    if conn.dialect.name == "postgresql":
        return sa.func.extract("epoch", end - start)
    # SQLite keeps UTC timestamps as ISO text; julianday() reads them (to ~0.1 ms: enough for capacity)
    return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0


def slot_limits(settings: Settings) -> SlotLimits:
    return SlotLimits(
        {name: p.max_concurrency for name, p in settings.providers.items() if p.enabled},
        settings.limits.platform_max_concurrency,
    )


class CapacityLiveService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings

    def report(self, window_s: float, *, target_utilization: float = 0.75) -> LiveReport:
        now = self._clock.now()
        since = now - timedelta(seconds=window_s)
        with self._engine.connect() as conn:
            per_provider = _measure_by_provider(conn, since, now, window_s)
            total = _measure_total(conn, since, now, window_s, per_provider)
        return assess(
            total,
            slot_limits(self._settings),
            poll_interval=self._settings.polling.min_interval_s,
            target_utilization=target_utilization,
            per_provider=per_provider,
        )


def _in(col: Any, since: datetime, now: datetime) -> ColumnElement[bool]:
    return sa.and_(col > since, col <= now)


def _measure_by_provider(conn: Connection, since: datetime, now: datetime, window_s: float) -> dict[str, Measured]:
    arrivals: dict[str | None, int] = dict(
        conn.execute(
            sa.select(_t.selected_provider, sa.func.count())
            .where(_in(_t.created_at, since, now))
            .group_by(_t.selected_provider)
        ).all()
    )
    runs = {
        r[0]: (r[1], r[2])
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
    in_flight: dict[str | None, int] = dict(
        conn.execute(
            sa.select(_a.provider, sa.func.count())
            .where(_a.submit_state.in_([s.value for s in ATTEMPT_IN_FLIGHT]))
            .group_by(_a.provider)
        ).all()
    )
    waiting: dict[str | None, int] = dict(
        conn.execute(
            sa.select(_t.selected_provider, sa.func.count())
            .where(_t.status.in_(_WAITING))
            .group_by(_t.selected_provider)
        ).all()
    )
    names = {n for n in (*arrivals, *runs, *in_flight, *waiting) if n is not None}
    no_runs = (None, 0)
    return {
        n: Measured(
            window_s=window_s,
            arrivals=int(arrivals.get(n, 0)),
            provider_seconds=_float(runs.get(n, no_runs)[0]),
            provider_samples=int(runs.get(n, no_runs)[1]),
            in_flight=int(in_flight.get(n, 0)),
            backlog=int(waiting.get(n, 0)),
        )
        for n in sorted(names)
    }


def _measure_total(
    conn: Connection, since: datetime, now: datetime, window_s: float, per_provider: dict[str, Measured]
) -> Measured:
    arrivals = conn.execute(sa.select(sa.func.count()).where(_in(_t.created_at, since, now))).scalar_one()
    run_mean, runs = conn.execute(
        sa.select(sa.func.avg(seconds_between(conn, _a.submitted_at, _a.completed_at)), sa.func.count()).where(
            _a.submit_state == AttemptStatus.SUCCEEDED.value,
            _a.submitted_at.is_not(None),
            _in(_a.completed_at, since, now),
        )
    ).one()
    finished, succeeded = _finished(conn, since, now)
    size_mean, outputs = conn.execute(
        sa.select(sa.func.avg(_as.size_bytes), sa.func.count(_as.size_bytes)).where(
            _as.kind == AssetKind.RAW_OUTPUT.value, _in(_as.created_at, since, now)
        )
    ).one()
    media_mean, media_n = _media(conn, since, now)
    transitions = conn.execute(
        sa.select(sa.func.count())
        .select_from(task_state_events.join(generation_tasks, _t.id == _e.task_id))
        .where(
            _e.outcome == StateEventOutcome.APPLIED.value,
            _e.from_status.is_not(None),
            _t.status.in_(_TERMINAL),
            _in(_t.finished_at, since, now),
        )
    ).scalar_one()
    return Measured(
        window_s=window_s,
        arrivals=int(arrivals),
        provider_seconds=_float(run_mean),
        provider_samples=int(runs),
        finished=finished,
        succeeded=succeeded,
        output_bytes=_float(size_mean),
        outputs=int(outputs),
        media_seconds=_float(media_mean),
        media_samples=media_n,
        transitions_per_task=transitions / finished if finished else None,
        in_flight=sum(m.in_flight for m in per_provider.values()),
        backlog=int(conn.execute(sa.select(sa.func.count()).where(_t.status.in_(_WAITING))).scalar_one()),
    )


def _finished(conn: Connection, since: datetime, now: datetime) -> tuple[int, int]:
    ok = sa.case((_t.status == TaskStatus.SUCCEEDED.value, 1), else_=0)
    total, succeeded = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ok), 0)).where(
            _t.status.in_(_TERMINAL), _in(_t.finished_at, since, now)
        )
    ).one()
    return int(total), int(succeeded)


def _media(conn: Connection, since: datetime, now: datetime) -> tuple[float | None, int]:
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


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
