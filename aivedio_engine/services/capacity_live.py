"""`aivedio capacity live`: measure the rates over a window, then hand them to the pure model.

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

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import capacity
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.domain.capacity_live import LiveReport, Measured, SlotLimits, assess


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


def _measure_by_provider(conn: Connection, since: datetime, now: datetime, window_s: float) -> dict[str, Measured]:
    arrivals = capacity.arrivals_by_provider(conn, since, now)
    runs = capacity.runs_by_provider(conn, since, now)
    in_flight = capacity.in_flight_by_provider(conn)
    waiting = capacity.waiting_by_provider(conn)
    names = {n for n in (*arrivals, *runs, *in_flight, *waiting) if n is not None}
    no_runs: tuple[float | None, int] = (None, 0)
    return {
        n: Measured(
            window_s=window_s,
            arrivals=int(arrivals.get(n, 0)),
            provider_seconds=runs.get(n, no_runs)[0],
            provider_samples=int(runs.get(n, no_runs)[1]),
            in_flight=int(in_flight.get(n, 0)),
            backlog=int(waiting.get(n, 0)),
        )
        for n in sorted(names)
    }


def _measure_total(
    conn: Connection, since: datetime, now: datetime, window_s: float, per_provider: dict[str, Measured]
) -> Measured:
    arrivals = capacity.arrivals(conn, since, now)
    run_mean, runs = capacity.runs(conn, since, now)
    finished, succeeded = capacity.finished(conn, since, now)
    size_mean, outputs = capacity.raw_outputs(conn, since, now)
    media_mean, media_n = capacity.media(conn, since, now)
    transitions = capacity.transitions(conn, since, now)
    return Measured(
        window_s=window_s,
        arrivals=arrivals,
        provider_seconds=run_mean,
        provider_samples=runs,
        finished=finished,
        succeeded=succeeded,
        output_bytes=size_mean,
        outputs=outputs,
        media_seconds=media_mean,
        media_samples=media_n,
        transitions_per_task=transitions / finished if finished else None,
        in_flight=sum(m.in_flight for m in per_provider.values()),
        backlog=capacity.waiting(conn),
    )
