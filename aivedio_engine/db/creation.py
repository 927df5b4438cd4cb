"""Creating a task: the one hot write of the API, as one statement on PostgreSQL.

The task, its four creation state events, the RESERVE ledger row, the `task.status.changed` outbox row (the
NOTIFY effect of the QUEUED decision, one for the three creation steps) and the balance decrement commit
together or not at all. There is no queued-intake message: the dispatcher scans
QUEUED tasks itself, and the commit wakes it (`wakeup.DISPATCH`). The notice also keeps the load-shedding
signal (the age of the oldest due outbox row) honest when nothing relays the outbox. On PostgreSQL they are one
data-modifying CTE, prepared once per connection and sent in one pipeline with BEGIN, the lock timeout and
COMMIT: one round trip per create instead of seventeen, and no SQLAlchemy statement built per call (why, with
the profiles: docs/decisions/0011-create-path.md).

Idempotency is the unique (tenant, key) index: `ON CONFLICT DO NOTHING` waits for a concurrent twin's
transaction and then yields no row, so the caller replays the committed task; a twin that is still running
after `IN_FLIGHT_WAIT_MS` is a lock timeout → "still in flight". The credits come from the task's balance stripe
(db/balances.py), taken by the CTE's UPDATE only when the stripe covers the cost; otherwise the statement raises
(`aivedio_insufficient_credits()`, migration 0011), the COMMIT sent with it does nothing, and the create runs again
on the slow path (`_create_core`), whose reservation draws on all of the tenant's stripes or refuses with the
whole balance. With the COMMIT in the same batch the stripe is locked only while the server commits — never across
a round trip to a busy API process — and concurrent creations of one tenant mostly lock different stripes.

SQLite (embedded mode) runs the same rows through SQLAlchemy Core under BEGIN IMMEDIATE, which serializes
writers, so the same contract holds there.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db import balances, ledger, outbox, tasks, wakeup
from aivedio_engine.db.records import Task
from aivedio_engine.db.session import pg_transaction, read_conn, run_prebuilt_on_loop, write_tx
from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.domain.status import EventSource, StateEventOutcome
from aivedio_engine.testing.failpoints import failpoint

IN_FLIGHT_WAIT_MS = 1500


@dataclass(frozen=True, slots=True)
class NewTask:
    id: uuid.UUID
    tenant_id: uuid.UUID
    key: str
    request_hash: bytes
    status: str
    version: int
    progress: int
    model: str
    provider: str | None
    priority: int
    cost: Decimal
    prompt: str
    params: dict[str, Any]
    deadline_at: datetime
    trace_id: str | None
    now: datetime
    #: (event_type, from_status, to_status, version) of each creation step, CREATED first
    history: tuple[tuple[str, str | None, str, int], ...]


class KeyTaken(Exception):
    """Another task holds the (tenant, key): the caller replays it."""


class KeyInFlight(Exception):
    """A concurrent request with the same key has not committed within IN_FLIGHT_WAIT_MS."""


class Unaffordable(Exception):
    def __init__(self, balance: Decimal) -> None:
        super().__init__(f"balance {balance}")
        self.balance = balance


TASK_COLUMNS = [c.name for c in generation_tasks.c]
_CREATE_SQL = f"""
WITH task AS (
    INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status, version, progress,
        requested_model, selected_provider, priority, estimated_cost, reserved_amount, prompt, params, deadline_at,
        trace_id, created_at, updated_at)
    VALUES (%(id)s, %(tenant_id)s, %(key)s, %(hash)s, %(status)s, %(version)s, %(progress)s, %(model)s,
        %(provider)s, %(priority)s, %(cost)s, %(cost)s, %(prompt)s, %(params)s, %(deadline)s, %(trace)s, %(now)s,
        %(now)s)
    ON CONFLICT (tenant_id, client_idempotency_key) DO NOTHING
    RETURNING *
), balance AS (
    UPDATE tenant_balance_stripes SET balance = balance - %(cost)s
    WHERE tenant_id = %(tenant_id)s AND stripe = {balances.STRIPE_OF_TASK_SQL.format(param="%(id)s")}
        AND balance >= %(cost)s AND EXISTS (SELECT FROM task)
    RETURNING balance
), events AS (
    INSERT INTO task_state_events (id, task_id, source, source_event_id, event_type, from_status, to_status,
        task_version, observed_at, outcome, created_at)
    SELECT e.id, task.id, %(source)s, task.id::text || ':' || e.version, e.event_type, e.from_status, e.to_status,
        e.version, %(now)s, %(applied)s, %(now)s
    FROM task, unnest(%(ev_ids)s::uuid[], %(ev_types)s::text[], %(ev_from)s::text[], %(ev_to)s::text[],
                      %(ev_versions)s::bigint[]) AS e(id, event_type, from_status, to_status, version)
), reserve AS (
    INSERT INTO credit_ledger (id, tenant_id, task_id, entry_type, amount, business_key, created_by, created_at)
    SELECT %(ledger_id)s, %(tenant_id)s, task.id, 'RESERVE', -%(cost)s, 'reserve:' || task.id::text, 'api', %(now)s
    FROM task
), notice AS (
    INSERT INTO outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, payload, status,
        target, available_at, tenant_id, trace_id, created_at)
    SELECT %(outbox_id)s, 'task', task.id, task.version, %(notice_type)s, %(notice_payload)s, 'PENDING',
        %(notice_target)s, %(now)s, %(tenant_id)s, %(trace)s, %(now)s
    FROM task
)
SELECT {", ".join(f"task.{c}" for c in TASK_COLUMNS)},
    CASE WHEN NOT EXISTS (SELECT FROM balance) THEN aivedio_insufficient_credits() END AS refused
FROM task
"""
#: the SQLSTATE of aivedio_insufficient_credits() (migration 0011)
_REFUSED = "AV402"
_LOCK_TIMEOUT_SQL = f"SELECT set_config('lock_timeout', '{IN_FLIGHT_WAIT_MS}ms', true)"
#: the settings of the loop pool's sessions (db/async_pool.py), which only ever run `create_on_loop`
LOOP_SESSION = {"lock_timeout": f"{IN_FLIGHT_WAIT_MS}ms"}


def create(engine: Engine, new: NewTask, *, whole_balance: bool = False) -> Task:
    """Insert the task and everything that commits with it; returns the task row. `whole_balance`: go straight to
    the reservation that draws on all of the tenant's stripes (the task's own was found short already).

    Raises KeyTaken (replay it), KeyInFlight, or Unaffordable; nothing is written then."""
    if whole_balance:
        return _create_core(engine, new, whole_balance=True)
    if engine.dialect.name == "postgresql":
        return _create_pg(engine, new)
    return _create_core(engine, new)


#: what every create statement binds the same way: the single CTE here and the batch (db/creation_batch.py)
FIXED_PARAMS: dict[str, Any] = {
    "source": EventSource.API.value,
    "applied": StateEventOutcome.APPLIED.value,
    "notice_type": EventType.TASK_STATUS_CHANGED.value,
    "notice_target": ROUTES[EventType.TASK_STATUS_CHANGED].actor,
}


def _pg_params(new: NewTask) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    return {
        "id": new.id,
        "tenant_id": new.tenant_id,
        "key": new.key,
        "hash": new.request_hash,
        "status": new.status,
        "version": new.version,
        "progress": new.progress,
        "model": new.model,
        "provider": new.provider,
        "priority": new.priority,
        "cost": new.cost,
        "prompt": new.prompt,
        "params": Jsonb(new.params),
        "deadline": new.deadline_at,
        "trace": new.trace_id,
        "now": new.now,
        **FIXED_PARAMS,
        "ev_ids": [new_id() for _ in new.history],
        "ev_types": [h[0] for h in new.history],
        "ev_from": [h[1] for h in new.history],
        "ev_to": [h[2] for h in new.history],
        "ev_versions": [h[3] for h in new.history],
        "ledger_id": new_id(),
        "outbox_id": new_id(),
        "notice_payload": Jsonb(notice_payload(new)),
    }


def _create_pg(engine: Engine, new: NewTask) -> Task:
    import psycopg

    params = _pg_params(new)
    for attempt in (1, 2):
        with engine.connect() as sa_conn:
            raw: psycopg.Connection[Any] = sa_conn.connection.driver_connection  # type: ignore[assignment]
            try:
                with pg_transaction(sa_conn):
                    # BEGIN, the insert and COMMIT go in one pipeline: a death before it is the only "before"
                    failpoint("create.before_commit")
                    row = _run_pg(raw, params)
                failpoint("create.after_commit")
            except _StripeShort:
                break
            except psycopg.OperationalError:
                if attempt == 2 or not raw.broken:
                    raise
                # a pooled connection the server dropped (restart, failover): nothing was committed on it, or
                # the commit's fate is unknown — either way the retry either creates or finds the task by key
                continue
        wakeup.committed(engine, (wakeup.OUTBOX, wakeup.DISPATCH))  # a QUEUED task: the dispatcher looks now
        return row
    # the task's stripe could not cover it: the same rows in a Core transaction whose reservation takes from all of
    # the tenant's stripes and spreads the rest over them again, or refuses with the whole balance
    return _create_core(engine, new, whole_balance=True)


async def create_on_loop(pool: Any, engine: Engine, new: NewTask) -> Task | None:
    """`create` for an event loop: the same statement, one round trip, on an async psycopg connection from `pool`
    (autocommit sessions with `LOOP_SESSION`, `db/async_pool.py`). Returns the task row, or None when the task's
    stripe could not cover it: nothing was written, and the caller runs `create(..., whole_balance=True)`
    (blocking) instead. Raises KeyTaken or KeyInFlight as `create` does."""
    import psycopg

    params = _pg_params(new)
    for attempt in (1, 2):
        async with pool.connection() as raw:
            try:
                failpoint("create.before_commit")
                row = await _run_pg_async(raw, params)
                failpoint("create.after_commit")
            except _StripeShort:
                return None
            except psycopg.OperationalError:
                if attempt == 2 or not raw.broken:
                    raise
                continue  # a connection the server dropped: as in `_create_pg`
        wakeup.committed(engine, (wakeup.OUTBOX, wakeup.DISPATCH))
        return row
    raise AssertionError("unreachable")  # pragma: no cover


async def _run_pg_async(raw: Any, params: dict[str, Any]) -> Task:
    """The CTE alone, in autocommit: one statement is its own transaction, so there is no BEGIN or COMMIT to send
    and no pipeline (psycopg's async pipeline handling took 30 % of the API's CPU under py-spy). The loop pool's
    sessions carry the lock timeout (`LOOP_SESSION`); a statement that raises has rolled itself back."""
    import psycopg

    try:
        cur = await raw.execute(_CREATE_SQL, params, prepare=True)
    except psycopg.errors.LockNotAvailable:
        raise KeyInFlight from None
    except psycopg.DatabaseError as exc:
        if exc.sqlstate != _REFUSED:
            raise
        raise _StripeShort from None
    return _created(await cur.fetchone())


async def by_key_on_loop(pool: Any, tenant_id: uuid.UUID, key: str) -> Task | None:
    """`by_key` on the loop pool: the task a taken key holds (None if it is gone meanwhile)."""
    async with pool.connection() as raw:
        cur = await run_prebuilt_on_loop(raw, _BY_KEY, {"tenant_id": tenant_id, "key": key})
        values = await cur.fetchone()
    return Task.of(values)


class _StripeShort(Exception):
    """The task's balance stripe could not cover it: nothing was written; the balance as a whole may still."""


def _run_pg(raw: Any, params: dict[str, Any]) -> Task:
    """BEGIN, the lock timeout, the CTE and COMMIT: one round trip. A stripe that cannot cover the reservation or a
    twin still in flight aborts the statement, and the COMMIT queued behind it then does nothing."""
    import psycopg

    try:
        with raw.pipeline():
            raw.execute("BEGIN")
            raw.execute(_LOCK_TIMEOUT_SQL, prepare=True)
            cur = raw.execute(_CREATE_SQL, params, prepare=True)
            raw.execute("COMMIT")
    except psycopg.errors.LockNotAvailable:
        raw.rollback()
        raise KeyInFlight from None
    except psycopg.DatabaseError as exc:
        if exc.sqlstate != _REFUSED:
            raise
        raw.rollback()
        raise _StripeShort from None
    return _created(cur.fetchone())


def _created(values: Any) -> Task:
    if values is None:  # the key was taken; nothing was written
        raise KeyTaken
    return Task(*values[:-1])  # the last column is the refusal guard


def _create_core(engine: Engine, new: NewTask, *, whole_balance: bool = False) -> Task:
    from sqlalchemy.exc import IntegrityError

    try:
        with write_tx(engine) as conn:
            if _by_key(conn, new.tenant_id, new.key) is not None:
                raise KeyTaken
            row = _insert_core(conn, new, whole_balance)
            failpoint("create.before_commit")
        failpoint("create.after_commit")
    except IntegrityError as exc:
        if "client_idempotency_key" not in str(exc.orig):
            raise
        raise KeyTaken from None
    return row


def _insert_core(conn: Connection, new: NewTask, whole_balance: bool) -> Task:
    row = conn.execute(
        generation_tasks.insert()
        .values(
            id=new.id,
            tenant_id=new.tenant_id,
            client_idempotency_key=new.key,
            request_hash=new.request_hash,
            status=new.status,
            version=new.version,
            progress=new.progress,
            requested_model=new.model,
            selected_provider=new.provider,
            priority=new.priority,
            estimated_cost=new.cost,
            reserved_amount=new.cost,
            prompt=new.prompt,
            params=new.params,
            deadline_at=new.deadline_at,
            trace_id=new.trace_id,
            created_at=new.now,
            updated_at=new.now,
        )
        .returning(*generation_tasks.c)
    ).one()
    record = Task(*row)
    tasks.record_events(
        conn,
        [
            tasks.event_row(
                task_id=new.id,
                source=EventSource.API,
                source_event_id=f"{new.id}:{version}",
                event_type=event_type,
                from_status=from_status,
                to_status=to_status,
                task_version=version,
                outcome=StateEventOutcome.APPLIED,
                now=new.now,
            )
            for event_type, from_status, to_status, version in new.history
        ],
    )
    outbox.add(
        conn,
        EventType.TASK_STATUS_CHANGED,
        aggregate_type="task",
        aggregate_id=new.id,
        aggregate_version=new.version,
        tenant_id=new.tenant_id,
        trace_id=new.trace_id,
        now=new.now,
        payload=notice_payload(new),
    )
    wakeup.notify(conn, wakeup.DISPATCH)
    try:
        ledger.reserve(
            conn,
            tenant_id=new.tenant_id,
            task_id=new.id,
            amount=new.cost,
            now=new.now,
            created_by="api",
            whole_balance=whole_balance,
        )
    except ledger.InsufficientBalance as exc:
        raise Unaffordable(exc.balance) from None
    return record


def notice_payload(new: NewTask) -> dict[str, Any]:
    return tasks.status_changed_payload(new.id, new.version, new.status, new.progress)


def by_key(engine: Engine, tenant_id: uuid.UUID, key: str) -> Task | None:
    with read_conn(engine) as conn:
        return _by_key(conn, tenant_id, key)


def _by_key(conn: Connection, tenant_id: uuid.UUID, key: str) -> Task | None:
    return Task.of(conn.execute(_BY_KEY, {"tenant_id": tenant_id, "key": key}).first())


#: the task a (tenant, key) holds; built once, run by both the blocking and the loop path
_BY_KEY = sa.select(generation_tasks).where(
    generation_tasks.c.tenant_id == sa.bindparam("tenant_id"),
    generation_tasks.c.client_idempotency_key == sa.bindparam("key"),
)
