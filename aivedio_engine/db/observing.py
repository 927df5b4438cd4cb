"""The reducer's reads on PostgreSQL, in one round trip.

A new observation needs four facts before anything can be decided: whether this delivery is the first (the
inbox row), its task (locked), the attempt (locked after its task: the engine's one lock order, `db.lock_order`), and
whether the observation was already recorded. Sent one by one they were four round trips; here they go as one
psycopg pipeline of prepared statements with the transaction's BEGIN (`db.session.pg_transaction`). SQLite
(embedded mode) has no such cost: the reducer reads through SQLAlchemy there.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
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
_READS = (_INBOX, _TASK, _ATTEMPT, _SEEN)
# the same four reads for a batch, as set statements (`claim_many`); the partial index on the job id needs its
# predicate spelled out
_JOBS = "SELECT * FROM unnest(%(providers)s::text[], %(jobs)s::text[])"
_MANY = (
    "INSERT INTO inbox_dedup (consumer_group, event_id, aggregate_id, processed_at) "
    "SELECT %(group)s, t.e, t.a, %(now)s FROM unnest(%(event_ids)s::uuid[], %(aggregate_ids)s::uuid[]) "
    "WITH ORDINALITY AS t(e, a, n) ORDER BY t.n "
    "ON CONFLICT (consumer_group, event_id) DO NOTHING RETURNING event_id",
    f"SELECT {_T_COLS} FROM generation_tasks WHERE id IN (SELECT task_id FROM task_attempts "
    f"WHERE provider_job_id IS NOT NULL AND (provider, provider_job_id) IN ({_JOBS})) ORDER BY id FOR UPDATE",
    f"SELECT {_A_COLS} FROM task_attempts WHERE provider_job_id IS NOT NULL "
    f"AND (provider, provider_job_id) IN ({_JOBS}) ORDER BY id FOR UPDATE",
    "SELECT source, source_event_id FROM task_state_events "
    "WHERE (source, source_event_id) IN (SELECT * FROM unnest(%(sources)s::text[], %(keys)s::text[]))",
)
_MANY_DIGESTS = (
    "UPDATE inbox_dedup d SET result_digest = v.digest "
    "FROM unnest(%(event_ids)s::uuid[], %(digests)s::text[]) AS v(e, digest) "
    "WHERE d.consumer_group = %(group)s AND d.event_id = v.e"
)
_DIGEST = (
    "UPDATE inbox_dedup SET result_digest = %(digest)s WHERE consumer_group = %(group)s AND event_id = %(event_id)s"
)


@dataclass(frozen=True, slots=True)
class Observed:
    """What `claim_many` needs of one observation."""

    event_id: uuid.UUID
    aggregate_id: uuid.UUID | None
    provider: str
    job_id: str
    source: str
    dedup_key: str


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
        cursors = [raw.cursor() for _ in _READS]
        for cur, sql in zip(cursors, _READS, strict=True):
            cur.execute(sql, params, prepare=True)
    # fetched after the block: inside it, each fetch would wait for a Flush of its own
    inbox, task, attempt, seen = (cur.fetchone() for cur in cursors)
    return Claimed(fresh=inbox is not None, attempt=Attempt.of(attempt), task=Task.of(task), seen=seen is not None)


def claim_many(raw: Any, *, group: str, now: datetime, batch: Sequence[Observed]) -> list[Claimed]:
    """BEGIN and the four reads of every observation in `batch`, as four set statements in one round trip.

    Tasks are locked in id order, then attempts in id order: any two batches lock in one order, and each task
    before its attempt (`db.lock_order`). An event id given twice is fresh at its first place only."""
    params = {
        "group": group,
        "now": now,
        "event_ids": [o.event_id for o in batch],
        "aggregate_ids": [o.aggregate_id for o in batch],
        "providers": [o.provider for o in batch],
        "jobs": [o.job_id for o in batch],
        "sources": [o.source for o in batch],
        "keys": [o.dedup_key for o in batch],
    }
    with raw.pipeline():
        raw.execute("BEGIN")
        cursors = [raw.cursor() for _ in _MANY]
        for cur, sql in zip(cursors, _MANY, strict=True):
            cur.execute(sql, params, prepare=True)
    inserted, task_rows, attempt_rows, seen_rows = (cur.fetchall() for cur in cursors)
    fresh = {row[0] for row in inserted}
    tasks = {t.id: t for t in map(Task.of, task_rows) if t is not None}
    attempts = {(a.provider, a.provider_job_id): a for a in map(Attempt.of, attempt_rows) if a is not None}
    seen_keys = {(row[0], row[1]) for row in seen_rows}
    out = []
    for o in batch:
        attempt = attempts.get((o.provider, o.job_id))
        first = o.event_id in fresh
        fresh.discard(o.event_id)
        out.append(
            Claimed(
                fresh=first,
                attempt=attempt,
                task=None if attempt is None else tasks.get(attempt.task_id),
                seen=(o.source, o.dedup_key) in seen_keys,
            )
        )
    return out


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


def commit_many(raw: Any, *, group: str, digests: Sequence[tuple[uuid.UUID, str]]) -> None:
    """Every inbox row's digest and COMMIT, one round trip."""
    params = {"group": group, "event_ids": [e for e, _ in digests], "digests": [d[:128] for _, d in digests]}
    with raw.pipeline():
        if digests:
            raw.execute(_MANY_DIGESTS, params, prepare=True)
        raw.execute("COMMIT")
