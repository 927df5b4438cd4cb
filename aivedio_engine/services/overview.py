"""The operator's overview (the TUI's first screen): every panel computed here, in one read, so two panels can
never count the same thing two ways.

Counts of stuck work come from the tasks table (the state a task is in), never from attempt rows: a task in
SUBMIT_UNKNOWN is counted once in the state panel, in the key figures and under its provider, while an attempt
left UNKNOWN by a task that moved on (reconciled, cancelled, parked) is not stuck work and is not counted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import server
from aivedio_engine.db.alerts import open_alerts
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.snapshot import read_snapshot
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.services.liveness import LivenessService, ProcessState

#: open alerts the overview lists (newest first); the Alerts screen has them all
ALERTS_SHOWN = 50


@dataclass(frozen=True)
class ProviderLoad:
    name: str
    #: attempts in flight at the provider (what its concurrency limit counts)
    active: int
    limit: int | None
    #: tasks in SUBMIT_UNKNOWN whose selected provider this is
    unknown: int
    orphans: int


@dataclass(frozen=True)
class AlertLine:
    raised_at: datetime
    severity: str
    rule: str
    message: str
    #: the alert's id, so the overview can open it on the Alerts screen
    id: uuid.UUID | None = None


@dataclass(frozen=True)
class RoleLine:
    role: str
    alive: int
    last_seen_age_s: float | None
    waiting: int
    #: "ok", "none running" (and nothing waits for it) or "MISSING: work waits"
    verdict: str
    where: str  # host:pid of the live processes


@dataclass(frozen=True)
class Overview:
    """The operational figures the metrics endpoint exports, read the way it reads them."""

    now: datetime
    #: unfinished tasks by status (finished ones are not counted: no index covers them, see db/snapshot.py)
    by_status: dict[str, int]
    queue_depth: int
    queue_p95_age_s: float | None
    queue_oldest_age_s: float | None
    submit_unknown: int
    outbox_due: int
    outbox_oldest_age_s: float | None
    dead_letters: int
    orphans: int
    reserved_credits: float
    reserved_oldest_age_s: float | None
    providers: list[ProviderLoad]
    alerts: list[AlertLine] = field(default_factory=list)
    #: the engine's roles from the heartbeats (`aivedio status`)
    roles: list[RoleLine] = field(default_factory=list)


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


class OverviewService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings, liveness: LivenessService) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._liveness = liveness

    def read(self) -> Overview:
        settings, now = self._settings, self._clock.now()
        with self._engine.connect() as conn, conn.begin():
            # the overview refreshes every few seconds: never let it pile up
            server.limit_statement_time(conn, settings.metrics.query_timeout_ms)
            snap = read_snapshot(
                conn, now, window_s=settings.metrics.window_s, urgent_within_s=settings.fetch.urgent_within_s
            )
            alert_rows = open_alerts(conn)
        by_status: dict[str, int] = {}
        unknown: dict[str, int] = {}
        for (status, provider), n in snap.tasks.items():
            by_status[status] = by_status.get(status, 0) + n
            if status == TaskStatus.SUBMIT_UNKNOWN.value:
                unknown[provider] = unknown.get(provider, 0) + n
        active: dict[str, int] = {}
        for (provider, _state), n in snap.attempts.items():
            active[provider] = active.get(provider, 0) + n
        limits = {name: p.max_concurrency for name, p in settings.providers.items() if p.enabled}
        names = sorted({*limits, *active, *snap.orphans, *(p for p in unknown if p)})
        providers = [
            ProviderLoad(n, active.get(n, 0), limits.get(n), unknown.get(n, 0), snap.orphans.get(n, 0)) for n in names
        ]
        alerts = [
            AlertLine(r.raised_at, r.severity, r.rule, r.message, r.id) for r in reversed(alert_rows[-ALERTS_SHOWN:])
        ]
        return Overview(
            now=now,
            by_status=dict(sorted(by_status.items())),
            queue_depth=by_status.get(TaskStatus.QUEUED.value, 0),
            queue_p95_age_s=_age(now, snap.queue_p95),
            queue_oldest_age_s=_age(now, snap.queue_oldest),
            submit_unknown=by_status.get(TaskStatus.SUBMIT_UNKNOWN.value, 0),
            outbox_due=int(snap.outbox_due or 0),
            outbox_oldest_age_s=_age(now, snap.outbox_oldest),
            dead_letters=int(snap.dead_letters),
            orphans=sum(snap.orphans.values()),
            reserved_credits=float(snap.reserved_credits),
            reserved_oldest_age_s=_age(now, snap.reserved_oldest),
            providers=providers,
            alerts=alerts,
            roles=self._roles(),
        )

    def _roles(self) -> list[RoleLine]:
        live = self._liveness.report()
        return [
            RoleLine(
                r.role,
                r.alive,
                r.last_seen_age_s,
                r.waiting,
                "ok" if r.alive else ("MISSING: work waits" if r.required and r.waiting else "none running"),
                ", ".join(
                    f"{p.beat.host}:{p.beat.pid}"
                    for p in live.processes
                    if r.role in p.beat.roles and p.state is ProcessState.ALIVE
                ),
            )
            for r in live.roles
        ]
