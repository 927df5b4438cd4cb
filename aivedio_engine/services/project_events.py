"""The event stream of one System B project (`GET /v1/projects/{id}/events`).

The stored history is the stream, as for generation tasks: every step transition and every change of the
project's own status is a `workflow_task_events` row with a per-project sequence number (taken under the project
row's lock, so numbers become visible in order), which is the SSE id a client resumes after. A fresh stream starts
with a `snapshot` event (the project as it is, no id), then the whole history, then each change as it commits.
Notifier signals only say "read again"; the stream also re-reads on every heartbeat, so a lost signal costs
latency, never an event. It ends once the project is terminal and its history up to the project's last sequence
number has been sent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aivedio_engine.db import workflows as repo
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import read_conn
from aivedio_engine.domain.project import PROJECT_TERMINAL
from aivedio_engine.notify import Notifier
from aivedio_engine.services.errors import NotFound


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: str  # "step" or "project"
    data: dict[str, Any]
    #: the SSE id (step events only: a project event does not move the resume position)
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class _Read:
    project: repo.Project
    steps: list[dict[str, Any]]


def _read(engine: Engine, tenant_id: uuid.UUID, project_id: uuid.UUID, after: int | None) -> _Read:
    with read_conn(engine) as conn:
        # the project first: its event counter and the events up to it commit together, so everything up to the
        # counter read here is in the history read next
        project = repo.project(conn, project_id, tenant_id)
        if project is None:  # a foreign project looks exactly like a missing one
            raise NotFound(f"project {project_id} not found")
        return _Read(project, repo.events_after(conn, project_id, after))


def _snapshot(p: repo.Project) -> StreamEvent:
    return StreamEvent(
        "snapshot",
        {
            "id": str(p.id),
            "status": p.status.value,
            "version": p.version,
            "seq": p.event_seq,
            "cost_actual": format(p.cost_actual, "f"),
            "at": p.updated_at.isoformat(),
        },
    )


def _event(row: dict[str, Any]) -> StreamEvent:
    seq = int(row["seq"])
    common = {
        "project_id": str(row["project_id"]),
        "seq": seq,
        "event": row["event"],
        "from": row["from_status"],
        "status": row["to_status"],
        "error_code": row["error_code"],
        "at": row["created_at"].isoformat(),
    }
    if row["workflow_task_id"] is None:
        return StreamEvent("project", common, seq)
    return StreamEvent("step", {**common, "step": row["step_key"], "type": row["task_type"]}, seq)


async def open_stream(
    engine: Engine,
    notifier: Notifier,
    tenant_id: uuid.UUID,
    project_id: uuid.UUID,
    after_seq: int | None,
    heartbeat_s: float,
    max_batch: int = 50,
) -> AsyncIterator[list[StreamEvent] | None]:
    """NotFound before any byte is sent for a foreign or missing project; then batches of events, or None after
    each `heartbeat_s` without news. A batch of more than `max_batch` history events keeps the newest ones and
    starts with a `snapshot`, so a client that fell far behind sees the project's latest state rather than an
    unbounded backlog (as `notifications.coalesce` does for a task)."""
    await asyncio.to_thread(_read, engine, tenant_id, project_id, 0)
    return _follow(engine, notifier, tenant_id, project_id, after_seq, heartbeat_s, max_batch)


async def _follow(
    engine: Engine,
    notifier: Notifier,
    tenant_id: uuid.UUID,
    project_id: uuid.UUID,
    after_seq: int | None,
    heartbeat_s: float,
    max_batch: int,
) -> AsyncIterator[list[StreamEvent] | None]:
    # project ids are UUIDs like task ids, so they share the task notifier's channel and fan-out
    with notifier.subscribe(project_id) as sub:
        after = after_seq or 0
        first = after_seq is None
        while True:
            try:
                read = await asyncio.to_thread(_read, engine, tenant_id, project_id, after)
            except NotFound:
                return
            steps = read.steps[-max_batch:]
            batch = [_snapshot(read.project)] if first or len(steps) < len(read.steps) else []
            first = False
            batch += [_event(r) for r in steps]
            if read.steps:
                after = int(read.steps[-1]["seq"])
            if batch:
                yield batch
            if read.project.status in PROJECT_TERMINAL and after >= read.project.event_seq:
                return
            if read.steps and after > read.project.event_seq:
                continue  # history newer than the project row read: read again before deciding to wait
            if not await sub.wait(heartbeat_s):
                yield None
