"""The reducer's reads on PostgreSQL, in one round trip.

A new observation needs four facts before anything can be decided: whether this delivery is the first (the
inbox row), its task (locked), the attempt (locked after its task: the engine's one lock order, `db.lock_order`), and
whether the observation was already recorded. Sent one by one they were four round trips; here they go as one
psycopg pipeline of prepared statements with the transaction's BEGIN (`db.session.pg_transaction`). SQLite
(embedded mode) has no such cost: the reducer reads through SQLAlchemy there.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.records import Attempt, Task
from aivedio_engine.db.tables import generation_tasks, task_attempts, task_state_events

_A_COLS = ", ".join(c.name for c in task_attempts.c)
_T_COLS = ", ".join(c.name for c in generation_tasks.c)
_INBOX = (
    "INSERT INTO inbox_dedup (consumer_group, event_id, aggregate_id, processed_at) "
    "VALUES (%(group)s, %(event_id)s, %(aggregate_id)s, %(now)s) "
    "ON CONFLICT (consumer_group, event_id) DO NOTHING RETURNING event_id"
)
_ATTEMPT = (
    f"SELECT {_A_COLS} FROM task_attempts WHERE provider = %(provider)s AND provider_job_id = %(job_id)s FOR UPDATE"
)
_TASK = (
    f"SELECT {_T_COLS} FROM generation_tasks WHERE id = (SELECT task_id FROM task_attempts "
    "WHERE provider = %(provider)s AND provider_job_id = %(job_id)s) FOR UPDATE"
)
_SEEN = "SELECT 1 FROM task_state_events WHERE source = %(source)s AND source_event_id = %(dedup_key)s"
_DIGEST = (
    "UPDATE inbox_dedup SET result_digest = %(digest)s WHERE consumer_group = %(group)s AND event_id = %(event_id)s"
)


@dataclass(frozen=True, slots=True)
class Claimed:
    fresh: bool  # False: another delivery of this event was consumed already
    attempt: Attempt | None  # None: no attempt has this job id (an orphan, or a job bound by request key)
    task: Task | None
    seen: bool  # the observation is in the task's history already


def claim(
    raw: Any,
    *,
    group: str,
    event_id: uuid.UUID,
    aggregate_id: uuid.UUID | None,
    now: datetime,
    provider: str,
    job_id: str,
    source: str,
    dedup_key: str,
) -> Claimed:
    """BEGIN and the four reads, one round trip."""
    params = {
        "group": group,
        "event_id": event_id,
        "aggregate_id": aggregate_id,
        "now": now,
        "provider": provider,
        "job_id": job_id,
        "source": source,
        "dedup_key": dedup_key,
    }
    with raw.pipeline():
        raw.execute("BEGIN")
        cursors = [raw.cursor() for _ in range(4)]
        for cur, sql in zip(cursors, (_INBOX, _TASK, _ATTEMPT, _SEEN), strict=True):
            cur.execute(sql, params, prepare=True)
    # fetched after the block: inside it, each fetch would wait for a Flush of its own
    inbox, task, attempt, seen = (cur.fetchone() for cur in cursors)
    return Claimed(fresh=inbox is not None, attempt=Attempt.of(attempt), task=Task.of(task), seen=seen is not None)


def seen(conn: Connection, source: str, dedup_key: str) -> bool:
    """Whether the observation is in a task's history already: `claim`'s fourth read, for the callers that did not
    make it (SQLite, and reductions outside the consumer)."""
    e = task_state_events.c
    stmt = sa.select(e.id).where(e.source == source, e.source_event_id == dedup_key)
    return conn.execute(stmt).first() is not None


def commit(raw: Any, *, group: str, event_id: uuid.UUID, digest: str | None) -> None:
    """The inbox row's digest (if any) and COMMIT, one round trip."""
    with raw.pipeline():
        if digest:
            raw.execute(_DIGEST, {"digest": digest[:128], "group": group, "event_id": event_id}, prepare=True)
        raw.execute("COMMIT")
