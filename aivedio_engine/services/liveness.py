"""Liveness: which engine processes run, what they do, and which role is missing while work waits for it.

Every role process runs a `HeartbeatWriter` on its own thread (started by `worker.runtime.Runtime`, so `aivedio
serve` and the engine embedded in `generate --wait` both have one). Each beat is a read of the backlog and one
short write of the process's row; a clean shutdown marks the row stopped. `LivenessService` reads the rows back
and classifies each process by age: alive (seen within `liveness.stale_after_s`), stale (not seen since: it
likely died), stopped (it said so). Ages are measured with this host's clock against the writer's; `aivedio
doctor` reports the skew between the two and the database.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from aivedio_engine import __version__
from aivedio_engine.clock import new_id
from aivedio_engine.db import heartbeats
from aivedio_engine.db.heartbeats import Backlog, Heartbeat
from aivedio_engine.db.session import read_conn, write_tx

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Engine

log = logging.getLogger(__name__)

#: the roles without which queued work never moves; `api` only takes requests in
REQUIRED_ROLES = ("relay", "worker", "scheduler", "sweeper")
ALL_ROLES = ("api", *REQUIRED_ROLES)
#: rows older than this are deleted by a starting process
PRUNE_AFTER = timedelta(days=7)
NO_ENGINE = "no engine is running: start `aivedio serve` (or `aivedio generations wait ID`) for this to take effect"


class ProcessState(StrEnum):
    ALIVE = "alive"
    STALE = "stale"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ProcessView:
    beat: Heartbeat
    state: ProcessState
    #: seconds since the process was last seen
    age_s: float

    def to_dict(self) -> dict[str, Any]:
        b = self.beat
        return {
            "id": str(b.id),
            "roles": list(b.roles),
            "host": b.host,
            "pid": b.pid,
            "version": b.version,
            "kind": b.kind,
            "state": self.state.value,
            "started_at": b.started_at.isoformat(),
            "last_seen": b.last_seen.isoformat(),
            "age_s": round(self.age_s, 1),
            "stopped_at": b.stopped_at.isoformat() if b.stopped_at else None,
            "activity": b.activity or {},
            "backlog": b.backlog.to_dict() if b.backlog else None,
        }


@dataclass(frozen=True)
class RoleView:
    role: str
    #: processes running the role and seen within `stale_after_s`
    alive: int
    #: seconds since any live (not stopped) process with this role was last seen; None: never seen
    last_seen_age_s: float | None
    #: how much work waits for this role (see `waiting_for`)
    waiting: int
    #: seconds since the last process with this role stopped cleanly; None: none stopped in the window
    stopped_age_s: float | None = None

    @property
    def required(self) -> bool:
        return self.role in REQUIRED_ROLES

    def to_dict(self) -> dict[str, Any]:
        age = None if self.last_seen_age_s is None else round(self.last_seen_age_s, 1)
        stopped = None if self.stopped_age_s is None else round(self.stopped_age_s, 1)
        return {
            "role": self.role,
            "alive": self.alive,
            "last_seen_age_s": age,
            "stopped_age_s": stopped,
            "waiting": self.waiting,
        }

    @property
    def newest_age_s(self) -> float | None:
        """Seconds since the newest heartbeat of any process with this role, stopped ones included (a clean stop
        is its last sign of life); None: none in the window. A process that died long ago never shadows a newer
        one that stopped."""
        ages = [a for a in (self.last_seen_age_s, self.stopped_age_s) if a is not None]
        return min(ages) if ages else None

    def missing(self, after_s: float) -> bool:
        """A required role no live process runs while work waits for it, and whose newest heartbeat is `after_s`
        old (or that was never seen): a restart within `after_s` is not an outage."""
        if not self.required or not self.waiting or self.alive:
            return False
        return self.newest_age_s is None or self.newest_age_s >= after_s

    @property
    def seen(self) -> str:
        """When a role with no live process was last seen (its newest heartbeat), in words."""
        if self.last_seen_age_s is not None and (
            self.stopped_age_s is None or self.last_seen_age_s <= self.stopped_age_s
        ):
            return f"last seen {self.last_seen_age_s:.0f} s ago"
        if self.stopped_age_s is not None:
            return f"the last one stopped {self.stopped_age_s:.0f} s ago"
        return "never seen"


@dataclass(frozen=True)
class LivenessReport:
    now: datetime
    processes: list[ProcessView]
    roles: list[RoleView]
    backlog: Backlog

    @property
    def engine_alive(self) -> bool:
        """Some process runs a background role: enqueued work will be picked up by someone."""
        return any(r.alive for r in self.roles if r.required)

    def stalled(self) -> list[str]:
        """One sentence per required role that no live process runs while work waits for it."""
        return [stall_message(r) for r in self.roles if r.required and r.waiting and not r.alive]

    def missing(self, after_s: float) -> list[RoleView]:
        """Required roles with work waiting, no live process, and no heartbeat within `after_s`."""
        return [r for r in self.roles if r.missing(after_s)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "engine_alive": self.engine_alive,
            "roles": [r.to_dict() for r in self.roles],
            "processes": [p.to_dict() for p in self.processes],
            "backlog": self.backlog.to_dict(),
        }


_WAITING_WORDS = {
    "relay": "outbox messages wait to be published",
    "worker": "messages wait",
    "scheduler": "tasks wait to be dispatched or polled",
    "sweeper": "unfinished tasks go unwatched (retries, deadlines, recovery)",
}


def stall_message(r: RoleView) -> str:
    return f"no {r.role} alive while {r.waiting} {_WAITING_WORDS.get(r.role, 'items wait')}"


def waiting_for(role: str, backlog: Backlog) -> int:
    """The work a missing `role` leaves standing still."""
    if role == "relay":
        return backlog.pending_outbox
    if role == "worker":
        return backlog.pending_outbox + backlog.worker_steps
    if role == "scheduler":
        return backlog.queued_tasks + backlog.due_tasks
    if role == "sweeper":
        return backlog.active_tasks
    return 0


def classify(beats: list[Heartbeat], backlog: Backlog, now: datetime, stale_after_s: float) -> LivenessReport:
    """Pure: rows + backlog + now → the report."""
    processes = []
    for b in beats:
        age = max(0.0, (now - b.last_seen).total_seconds())
        if b.stopped_at is not None:
            state = ProcessState.STOPPED
        elif age < stale_after_s:
            state = ProcessState.ALIVE
        else:
            state = ProcessState.STALE
        processes.append(ProcessView(b, state, age))
    roles = []
    for role in ALL_ROLES:
        running = [p for p in processes if role in p.beat.roles and p.state is not ProcessState.STOPPED]
        ages = [p.age_s for p in running]
        stopped = [p.age_s for p in processes if role in p.beat.roles and p.state is ProcessState.STOPPED]
        roles.append(
            RoleView(
                role,
                alive=sum(1 for p in running if p.state is ProcessState.ALIVE),
                last_seen_age_s=min(ages) if ages else None,
                waiting=waiting_for(role, backlog),
                stopped_age_s=min(stopped) if stopped else None,
            )
        )
    return LivenessReport(now, processes, roles, backlog)


class LivenessService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings

    def report(self) -> LivenessReport:
        cfg = self._settings.liveness
        now = self._clock.now()
        # the window reaches back far enough that a role missing for role_missing_s still has its last row
        window = max(cfg.history_s, self._settings.alerts.role_missing_s)
        with read_conn(self._engine) as conn:
            beats = heartbeats.recent(conn, now - timedelta(seconds=window))
            backlog = heartbeats.backlog(conn, now)
        return classify(beats, backlog, now, cfg.stale_after_s)

    def engine_alive(self) -> bool:
        return self.report().engine_alive


@dataclass
class HeartbeatWriter:
    """One process's heartbeat: `start()` a thread that beats every `liveness.heartbeat_interval_s`, `stop()` on
    shutdown (marks the row stopped). A failed beat is logged and retried next interval: a database hiccup must
    not stop the roles, and a process that cannot write its heartbeat shows up as stale, which is the truth."""

    engine: Engine
    clock: Clock
    settings: Settings
    roles: frozenset[str]
    kind: str = "serve"
    #: what the process is doing, per role, in words (the runtime's view of its threads)
    activity: Callable[[], dict[str, str]] = dict
    #: runs after each beat on the heartbeat thread (the role_missing check); its failures are logged like a beat's
    after_beat: Callable[[], object] | None = None
    process_id: uuid.UUID = field(default_factory=new_id)
    started_at: datetime | None = None
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def beat(self) -> Heartbeat:
        now = self.clock.now()
        if self.started_at is None:
            self.started_at = now
            with write_tx(self.engine) as conn:
                heartbeats.prune(conn, now - PRUNE_AFTER)
        with read_conn(self.engine) as conn:
            backlog = heartbeats.backlog(conn, now)
        hb = Heartbeat(
            id=self.process_id,
            roles=tuple(sorted(self.roles)),
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            kind=self.kind,
            started_at=self.started_at,
            last_seen=now,
            activity=self.activity(),
            backlog=backlog,
        )
        with write_tx(self.engine) as conn:
            heartbeats.beat(conn, hb)
        if self.after_beat is not None:
            self.after_beat()
        return hb

    def start(self) -> None:
        self._beat_logged()  # the first row exists before the roles start taking work
        self._thread = threading.Thread(target=self._run, name="aivedio-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            with write_tx(self.engine) as conn:
                heartbeats.mark_stopped(conn, self.process_id, self.clock.now())
        except Exception:
            log.warning("could not mark this process stopped in process_heartbeats", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.liveness.heartbeat_interval_s):
            self._beat_logged()

    def _beat_logged(self) -> None:
        try:
            self.beat()
        except Exception:
            log.warning("heartbeat failed; retrying in %gs", self.settings.liveness.heartbeat_interval_s, exc_info=True)
