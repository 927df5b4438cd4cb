"""Legacy `generation.queued` consumer: mark a still-queued task as ready for the dispatcher.

Nothing writes `generation.queued` any more: the dispatcher scans QUEUED tasks itself and creation wakes it after
its commit. This consumer stays so that rows an older version left in an outbox are consumed (deduplicated, and
harmless) instead of going DEAD. No state change happens here. The task's `version` is the guard: the event
announces version N, and if the task has moved on since (canceled, expired, already dispatched) the event is
stale and does nothing. The guard is part of the UPDATE itself, so a concurrent cancel can never be overwritten
by a late `generation.queued`.
"""

from __future__ import annotations

from datetime import datetime

from aivedio_engine.db import tasks, wakeup
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.services.consume import Envelope, Outcome, consume_once

#: one consumer group per effect: another effect on the same event (e.g. notifications) dedups separately.
CONSUMER_GROUP = "intake"


def mark_ready_for_dispatch(engine: Engine, envelope: Envelope, *, now: datetime) -> Outcome:
    """Consume one `generation.queued` event: QUEUED task at the announced version → `next_action_at = now`."""

    def effect(conn: Connection) -> str:
        if tasks.mark_ready(conn, envelope.aggregate_id, envelope.aggregate_version, now):
            wakeup.notify(conn, wakeup.DISPATCH)  # the dispatcher looks now, not at its next tick
            return "ready"
        # Why not: kept in the inbox digest so an operator can tell a stale event from a missing task.
        current = tasks.status_version(conn, envelope.aggregate_id)
        if current is None:
            return "skipped: task not found"
        return f"skipped: status={current.status} version={current.version}"

    return consume_once(engine, CONSUMER_GROUP, envelope.event_id, envelope.aggregate_id, effect, now)
