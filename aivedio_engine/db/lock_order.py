"""The engine's one lock order: a task row first, then its attempt, in one transaction.

Two writers that lock the same pair in opposite orders deadlock (PostgreSQL aborts one), and a writer that moves
an attempt it read without the task's lock can leave the two behind each other (a SUCCEEDED task with a RUNNING
attempt that keeps its slot and is polled forever, issue 14). So every attempt lock is taken under its task's
lock: `tasks.read(lock=True)` notes the task here, and `attempts.read/by_job(lock=True)` refuse an attempt whose
task this transaction has not locked. `services.transition.lock_attempt` is the one way services take the pair.

The note lives on the connection, keyed by the SQLAlchemy transaction it was taken in, so a pooled connection
never carries it into its next transaction. A connection outside an SQLAlchemy transaction (the reducer's one
pipelined round trip, `db.session.pg_transaction`) is not checked: its statements are written in this order.
Only PostgreSQL takes row locks; SQLite serialises writers with BEGIN IMMEDIATE, so nothing is checked there.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection

from aivedio_engine.db.session import for_transaction

_KEY = "aivedio.locked_tasks"


class LockOrderViolation(RuntimeError):
    """An attempt was locked before its task: a bug in the caller, never a condition to retry."""


def _held(conn: Connection) -> set[uuid.UUID] | None:
    return for_transaction(conn, _KEY, set)


def note_task_locked(conn: Connection, task_id: uuid.UUID) -> None:
    held = _held(conn)
    if held is not None:
        held.add(uuid.UUID(str(task_id)))


def require_task_locked(conn: Connection, task_id: uuid.UUID, attempt_id: uuid.UUID) -> None:
    if conn.dialect.name != "postgresql":
        return
    held = _held(conn)
    if held is not None and uuid.UUID(str(task_id)) not in held:
        raise LockOrderViolation(
            f"attempt {attempt_id} locked before its task {task_id}: lock the task first (transition.lock_attempt)"
        )
