"""Process heartbeats (`process_heartbeats`) and the backlog each role works on: the SQL of liveness.

A row belongs to one process: it inserts it at start, moves `last_seen` every few seconds and sets `stopped_at`
on a clean shutdown. Readers (`aivedio status`, the role_missing rule, the TUI) decide what an age means.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.session import dialect_insert
from aivedio_engine.db.tables import generation_tasks, outbox_events, process_heartbeats
from aivedio_engine.domain.status import TASK_TERMINAL, OutboxStatus, TaskStatus

_h, _t, _o = process_heartbeats.c, generation_tasks.c, outbox_events.c
_TERMINAL = sorted(s.value for s in TASK_TERMINAL)
#: task states whose next step runs on a worker (a consumed message), not in the scheduler or the sweeper
WORKER_STEPS = (
    TaskStatus.DISPATCHING.value,
    TaskStatus.OUTPUT_FETCHING.value,
    TaskStatus.POST_PROCESSING.value,
    TaskStatus.CANCEL_REQUESTED.value,
)


@dataclass(frozen=True)
class Backlog:
    """The work waiting in the database, as a role process sees it at one moment."""

    #: outbox rows due and not yet published: they wait for a relay, then a worker
    pending_outbox: int = 0
    #: QUEUED tasks: they wait for the scheduler's dispatcher
    queued_tasks: int = 0
    #: live tasks whose next action (poll, lookup, retry) is due: the scheduler or the sweeper acts on them
    due_tasks: int = 0
    #: tasks in a step a worker carries out (fetching, processing, dispatching, cancelling)
    worker_steps: int = 0
    #: tasks not finished and not held for a human: the sweeper watches their deadlines and recovery
    active_tasks: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "pending_outbox": self.pending_outbox,
            "queued_tasks": self.queued_tasks,
            "due_tasks": self.due_tasks,
            "worker_steps": self.worker_steps,
            "active_tasks": self.active_tasks,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Backlog:
        data = data or {}
        return cls(**{k: int(data.get(k) or 0) for k in cls().to_dict()})


@dataclass(frozen=True)
class Heartbeat:
    id: uuid.UUID
    roles: tuple[str, ...]
    host: str
    pid: int
    version: str
    kind: str
    started_at: datetime
    last_seen: datetime
    stopped_at: datetime | None = None
    activity: dict[str, str] | None = None
    backlog: Backlog | None = None


def beat(conn: Connection, hb: Heartbeat) -> None:
    """Insert the process's row, or move its `last_seen`, activity and backlog (one statement)."""
    insert = dialect_insert(conn)
    values: dict[str, Any] = {
        "id": hb.id,
        "roles": ",".join(sorted(hb.roles))[:128],
        "host": hb.host[:255],
        "pid": hb.pid,
        "version": hb.version[:64],
        "kind": hb.kind[:32],
        "started_at": hb.started_at,
        "last_seen": hb.last_seen,
        "stopped_at": hb.stopped_at,
        "activity": hb.activity,
        "backlog": hb.backlog.to_dict() if hb.backlog is not None else None,
    }
    stmt = insert(process_heartbeats).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[_h.id],
        set_={k: values[k] for k in ("last_seen", "stopped_at", "activity", "backlog")},
    )
    conn.execute(stmt)


def mark_stopped(conn: Connection, process_id: uuid.UUID, now: datetime) -> bool:
    """A clean shutdown: the row says so, and readers stop counting the process."""
    result = conn.execute(
        sa.update(process_heartbeats)
        .where(_h.id == process_id)
        .values(stopped_at=now, last_seen=now, activity={"process": "stopped"})
    )
    return result.rowcount == 1


def recent(conn: Connection, since: datetime) -> list[Heartbeat]:
    """Rows seen since `since`, newest first."""
    rows = conn.execute(sa.select(process_heartbeats).where(_h.last_seen >= since).order_by(_h.last_seen.desc()))
    return [
        Heartbeat(
            id=r.id,
            roles=tuple(x for x in r.roles.split(",") if x),
            host=r.host,
            pid=r.pid,
            version=r.version,
            kind=r.kind,
            started_at=r.started_at,
            last_seen=r.last_seen,
            stopped_at=r.stopped_at,
            activity=r.activity,
            backlog=Backlog.from_dict(r.backlog) if r.backlog is not None else None,
        )
        for r in rows
    ]


def prune(conn: Connection, before: datetime) -> int:
    return conn.execute(sa.delete(process_heartbeats).where(_h.last_seen < before)).rowcount


def backlog(conn: Connection, now: datetime) -> Backlog:
    """Counts over partial indexes (pending outbox, live tasks); a handful of aggregates, no row is read twice."""
    pending = conn.execute(
        sa.select(sa.func.count()).where(_o.status == OutboxStatus.PENDING.value, _o.available_at <= now)
    ).scalar_one()
    live = _t.status.not_in(_TERMINAL)
    queued, due, worker, active = conn.execute(
        sa.select(
            sa.func.count().filter(_t.status == TaskStatus.QUEUED.value),
            sa.func.count().filter(
                sa.or_(
                    _t.next_action_at <= now, sa.and_(_t.status == TaskStatus.RETRY_WAIT.value, _t.next_retry_at <= now)
                )
            ),
            sa.func.count().filter(_t.status.in_(WORKER_STEPS)),
            sa.func.count().filter(_t.status != TaskStatus.MANUAL_REVIEW.value),
        ).where(live)
    ).one()
    return Backlog(int(pending), int(queued or 0), int(due or 0), int(worker or 0), int(active or 0))


def database_now(conn: Connection) -> datetime | None:
    """The database server's clock (PostgreSQL); None on SQLite, which shares this host's clock."""
    if conn.dialect.name != "postgresql":
        return None
    value: datetime = conn.execute(sa.select(sa.func.now())).scalar_one()
    return value
