"""Status change notifications: the SSE wake-up of a `task.status.changed`, the task summary line
of a terminal one, and the SSE event source.

The stored state event history is the stream: an event is one applied transition, its id the task version it
produced. Signals from the notifier only say "read again", so a resumed, duplicated or reordered signal can
never produce a duplicate, out-of-order or foreign event. `GET /v1/generations/{id}` stays the source of truth.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

from aivedio_engine.db import tasks
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.records import Task
from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.notify import Notifier, Subscription
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.errors import NotFound

log = structlog.get_logger("aivedio.tasks")


def signal(notifier: Notifier, envelope: Envelope) -> None:
    """Wake the streams of a `task.status.changed` task (no inbox dedup: streams dedupe by version). Best effort:
    the notifier drops a signal it cannot send, and the streams find the change on their next read."""
    notifier.publish(envelope.aggregate_id, envelope.aggregate_version)


def is_terminal(envelope: Envelope) -> bool:
    """Whether a `task.status.changed` message announces a terminal status."""
    status = envelope.payload.get("status")
    return isinstance(status, str) and bool(status) and TaskStatus(status) in TASK_TERMINAL


def log_summary(engine: Engine, task_id: uuid.UUID) -> None:
    """The per-task summary — input and output summaries, provider, cost, time, error,
    retries — read after the commit, so the settled cost is in it. Never the prompt."""
    with engine.connect() as conn:
        row = tasks.read(conn, task_id)
    if row is None:
        return
    params = row.params or {}
    finished = row.finished_at or row.updated_at
    log.info(
        "task.finished",
        task_id=str(row.id),
        tenant_id=str(row.tenant_id),
        trace_id=row.trace_id,
        status=row.status,
        model=row.requested_model,
        provider=row.selected_provider,
        input={
            "duration_s": params.get("duration_s"),
            "resolution": params.get("resolution"),
            "aspect_ratio": params.get("aspect_ratio"),
            "references": len(params.get("asset_ids") or []),
        },
        output_asset_id=row.output_asset_id and str(row.output_asset_id),
        estimated_cost=str(row.estimated_cost),
        actual_cost=row.actual_cost and str(row.actual_cost),
        seconds=round((finished - row.created_at).total_seconds(), 3),
        attempts=int(row.current_attempt_no),
        error_class=row.last_error_class,
        error_code=row.last_error_code,
        cancel=row.cancel_outcome,
    )


@dataclass(frozen=True, slots=True)
class _Read:
    events: list[dict[str, Any]]
    #: the task's status when read; with `version`, tells a stream that nothing more can follow
    status: str
    version: int

    @property
    def finished(self) -> bool:
        return TaskStatus(self.status) in TASK_TERMINAL


def history(
    engine: Engine, tenant_id: uuid.UUID, task_id: uuid.UUID, after_version: int | None = None
) -> list[dict[str, Any]]:
    """Applied state changes of the tenant's task after `after_version` (all of them for None), oldest first,
    as `{"id", "status", "version", "progress", "at"}`. A foreign or missing task is NotFound, as for GET."""
    return _read(engine, tenant_id, task_id, after_version).events


def _read(engine: Engine, tenant_id: uuid.UUID, task_id: uuid.UUID, after_version: int | None) -> _Read:
    with engine.connect() as conn:
        # the task first: its transition and history row commit together, so every version up to the one read
        # here is already in the history read next
        task = _owned_task(conn, tenant_id, task_id)
        rows = tasks.applied_history(conn, task_id, after_version)
    version = int(task.version)
    return _Read([_event(task_id, row, task, version) for row in rows], task.status, version)


def _owned_task(conn: Connection, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task:
    task = tasks.read(conn, task_id, tenant_id)
    if task is None:  # the same answer as for a missing task: a foreign id must not be distinguishable
        raise NotFound(f"generation {task_id} not found")
    return task


def _check_owner(engine: Engine, tenant_id: uuid.UUID, task_id: uuid.UUID) -> None:
    with engine.connect() as conn:
        _owned_task(conn, tenant_id, task_id)


def _event(task_id: uuid.UUID, row: tasks.AppliedChange, task: Task, task_version: int) -> dict[str, Any]:
    # history rows do not store progress: the current one is on the task, earlier ones only where the
    # transition's payload recorded it (provider observations do)
    if int(row.task_version) == task_version:
        progress: int | None = int(task.progress)
    else:
        recorded = (row.payload or {}).get("progress")
        progress = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else None
    return {
        "id": str(task_id),
        "status": row.to_status,
        "version": int(row.task_version),
        "progress": progress,
        "at": row.created_at.isoformat(),
    }


async def open_stream(
    engine: Engine,
    notifier: Notifier,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    after_version: int | None,
    heartbeat_s: float,
    max_batch: int = 50,
) -> AsyncIterator[list[dict[str, Any]] | None]:
    """Check the task belongs to the tenant (NotFound before any byte is sent), then return the stream: batches
    of events after `after_version` (at most `max_batch`, the newest: see `coalesce`), or None after every
    `heartbeat_s` without news; it ends once the task's terminal event has been yielded."""
    await asyncio.to_thread(_check_owner, engine, tenant_id, task_id)
    return _follow(engine, notifier, tenant_id, task_id, after_version, heartbeat_s, max_batch)


def coalesce(events: list[dict[str, Any]], max_batch: int) -> list[dict[str, Any]]:
    """The newest `max_batch` events of a batch. A stream is only read
    again once its previous write drained, and every signal in between collapses into that one read, so a burst
    or a slow client yields one batch; this bounds it, so a client that fell far behind gets the latest state
    (whose version it resumes after) instead of an unbounded backlog. The full history stays in the database
    (`aivedio tasks show ID` merges it into the task's timeline)."""
    return events[-max_batch:] if len(events) > max_batch else events


async def _follow(
    engine: Engine,
    notifier: Notifier,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    after_version: int | None,
    heartbeat_s: float,
    max_batch: int,
) -> AsyncIterator[list[dict[str, Any]] | None]:
    # subscribed before the first read: a change committed after that read still wakes the wait below
    with notifier.subscribe(task_id) as sub:
        after = after_version
        woken = False
        while True:
            try:
                if woken:  # one read per wake-up for all the task's streams in this process
                    read = _since(await _shared_read(engine, tenant_id, sub), after)
                else:  # the first read, and each heartbeat's: this stream's own
                    read = await asyncio.to_thread(_read, engine, tenant_id, task_id, after)
            except NotFound:
                return  # checked at open; gone since (tenant removed): nothing more to say
            if read.events:
                after = read.events[-1]["version"]
                yield coalesce(read.events, max_batch)
            if read.finished and (after is None or after >= read.version):
                return
            # a timeout re-reads too: signals may be lost (Redis reconnect, a process without a notify worker)
            woken = await sub.wait(heartbeat_s)
            if not woken:
                yield None  # the caller's heartbeat


#: reads in flight, per event loop, engine and (tenant, task): (the signal number when it started, the read)
_inflight: dict[tuple[int, int, uuid.UUID, uuid.UUID], tuple[int, asyncio.Future[_Read]]] = {}


async def _shared_read(engine: Engine, tenant_id: uuid.UUID, sub: Subscription) -> _Read:
    """The task's whole history, from a read that started after the signal that woke `sub`: one already in flight
    when there is one (a signal to N streams costs one read, not N), else a new one the next streams can join.
    The tenant is part of the key, so a read is only ever shared by streams that passed the same owner check."""
    loop = asyncio.get_running_loop()
    key = (id(loop), id(engine), tenant_id, sub.task_id)
    entry = _inflight.get(key)
    if entry is None or entry[0] < sub.woken_seq:
        started = sub.current_seq()
        future = loop.create_task(asyncio.to_thread(_read, engine, tenant_id, sub.task_id, None))
        _inflight[key] = entry = (started, future)

        def done(f: asyncio.Future[_Read]) -> None:
            if _inflight.get(key, (0, None))[1] is f:
                del _inflight[key]
            if not f.cancelled():
                f.exception()  # retrieved here: every waiter may have gone (clients closed) before it ended

        future.add_done_callback(done)
    # shielded: one stream closing must not cancel the read the others wait for
    return await asyncio.shield(entry[1])


def _since(read: _Read, after: int | None) -> _Read:
    if after is None:
        return read
    return _Read([e for e in read.events if e["version"] > after], read.status, read.version)
