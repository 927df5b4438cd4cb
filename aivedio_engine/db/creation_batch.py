"""Creates waiting on one API process's event loop, sent to PostgreSQL several to a statement.

`creation.create_on_loop` costs one statement, one commit and one pool checkout per task; under load the API's
CPU went to psycopg's per-statement work and the server's to one commit per task. Here a create that finds a
statement of its process running waits for the next one, which carries every create that queued meanwhile (up to
`MAX_BATCH`): a lone create is sent at once, and a batch grows only while the server is busy anyway. One
statement at a time per process made the batches biggest (bench api_create: API CPU per create ~700-770 us
against ~700-1,170 us with two); a statement that has been running for `STALLED_S` (waiting on a lock, say a
twin's key held by another process's transaction) no longer holds up the rest: a second one is sent beside it.

Batches that only grow while a statement runs stayed small (bench api_create, 16 clients on 2 processes: 2.8
creates a statement, 42 % of statements a lone create), because a request spends part of its way waiting on
its rate-limit token: when the sender was free, the others were still on their way. So a sender about to send
waits, up to LINGER_S, for the requests that were on their way to `create` at that moment (`expecting`, entered
by `LoopCreate`), not for the ones that start meanwhile. A lone request (nobody on the way) is still sent at once.
With it: 4.4-5.2 creates a statement, API CPU per create 540-660 us instead of 760, PostgreSQL's 260-310 instead
of 400.

The batch statement writes what `create_on_loop` writes for each task — the task, its four state events, the
RESERVE row, the notice, the stripe's decrement — or nothing at all. A key already taken yields no row (that
caller replays the task, as `KeyTaken` says); anything else that stops the statement (a stripe short for the
batch's sum, a twin still in flight, a deadlock) rolls the whole batch back and each of its creates runs alone
through `create_on_loop`, so a batch never changes an answer, only how many statements it took. Locks are taken
in one order: the keys in (tenant, key) order by the insert, the stripes in (tenant, stripe) order by
`SELECT … FOR UPDATE` before the decrement, so two batches do not deadlock on each other's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from aivedio_engine.clock import new_id
from aivedio_engine.db import balances, creation, wakeup
from aivedio_engine.db.creation import FIXED_PARAMS, TASK_COLUMNS, KeyTaken, NewTask, notice_payload
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.records import Task
from aivedio_engine.observability.metrics import CREATE_BATCH_FALLBACKS, CREATE_BATCHES
from aivedio_engine.testing.failpoints import failpoint

#: statements of one process running at once: the second only beside one that has run for STALLED_S
MAX_IN_FLIGHT = 2
STALLED_S = 0.05
#: creates in one statement at most (the rest wait for the next)
MAX_BATCH = 64
#: how long a sender waits at most for creates already on their way (`expecting`) before it sends what it has
LINGER_S = 0.002

#: one JSON document per statement carries every task's values: psycopg dumps one string instead of a typed array
#: per column (its array dumpers, element by element, took more of the API's CPU than the rest of the batch);
#: orjson writes it (the stdlib's encoder: ~50 us a batch of 5, 5 % of the API's CPU under py-spy; orjson ~4 us)
_TASK_RECORD = """i(id uuid, tenant_id uuid, key text, hash text, status text, version bigint, progress smallint,
    model text, provider text, priority integer, cost numeric, prompt text, params jsonb, deadline timestamptz,
    trace text, now timestamptz, ledger_id uuid, outbox_id uuid, notice jsonb)"""
_EVENT_RECORD = "e(id uuid, task uuid, type text, from_status text, to_status text, version bigint)"

_BATCH_SQL = f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(tasks)s::jsonb) AS {_TASK_RECORD}
), task AS (
    INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status, version, progress,
        requested_model, selected_provider, priority, estimated_cost, reserved_amount, prompt, params, deadline_at,
        trace_id, created_at, updated_at)
    SELECT id, tenant_id, key, decode(hash, 'hex'), status, version, progress, model, provider, priority, cost, cost,
        prompt, params, deadline, trace, now, now
    FROM input ORDER BY tenant_id, key
    ON CONFLICT (tenant_id, client_idempotency_key) DO NOTHING
    RETURNING *
), made AS (
    SELECT i.*, {balances.STRIPE_OF_TASK_SQL.format(param="i.id")} AS stripe FROM task JOIN input i ON i.id = task.id
), need AS (
    SELECT tenant_id, stripe, sum(cost) AS cost FROM made GROUP BY tenant_id, stripe
), locked AS (
    SELECT s.tenant_id, s.stripe FROM tenant_balance_stripes s JOIN need n ON n.tenant_id = s.tenant_id
        AND n.stripe = s.stripe
    ORDER BY s.tenant_id, s.stripe FOR UPDATE OF s
), balance AS (
    UPDATE tenant_balance_stripes s SET balance = s.balance - n.cost
    FROM need n JOIN locked l ON l.tenant_id = n.tenant_id AND l.stripe = n.stripe
    WHERE s.tenant_id = n.tenant_id AND s.stripe = n.stripe AND s.balance >= n.cost
    RETURNING s.stripe
), events AS (
    INSERT INTO task_state_events (id, task_id, source, source_event_id, event_type, from_status, to_status,
        task_version, observed_at, outcome, created_at)
    SELECT e.id, m.id, %(source)s, m.id::text || ':' || e.version, e.type, e.from_status, e.to_status, e.version,
        m.now, %(applied)s, m.now
    FROM made m JOIN jsonb_to_recordset(%(events)s::jsonb) AS {_EVENT_RECORD} ON e.task = m.id
), reserve AS (
    INSERT INTO credit_ledger (id, tenant_id, task_id, entry_type, amount, business_key, created_by, created_at)
    SELECT m.ledger_id, m.tenant_id, m.id, 'RESERVE', -m.cost, 'reserve:' || m.id::text, 'api', m.now
    FROM made m
), notice AS (
    INSERT INTO outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, payload, status,
        target, available_at, tenant_id, trace_id, created_at)
    SELECT m.outbox_id, 'task', m.id, m.version, %(notice_type)s, m.notice, 'PENDING', %(notice_target)s, m.now,
        m.tenant_id, m.trace, m.now
    FROM made m
)
SELECT {", ".join(f"task.{c}" for c in TASK_COLUMNS)},
    CASE WHEN (SELECT count(*) FROM balance) < (SELECT count(*) FROM need) THEN aivedio_insufficient_credits() END
FROM task
"""


def _batch_params(news: Sequence[NewTask]) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for new in news:
        task_id = new.id.hex
        tasks.append(
            {
                "id": task_id,
                "tenant_id": new.tenant_id.hex,
                "key": new.key,
                "hash": new.request_hash.hex(),
                "status": new.status,
                "version": new.version,
                "progress": new.progress,
                "model": new.model,
                "provider": new.provider,
                "priority": new.priority,
                "cost": str(new.cost),
                "prompt": new.prompt,
                "params": new.params,
                "deadline": new.deadline_at.isoformat(),
                "trace": new.trace_id,
                "now": new.now.isoformat(),
                "ledger_id": new_id().hex,
                "outbox_id": new_id().hex,
                "notice": notice_payload(new),
            }
        )
        events += (
            {"id": new_id().hex, "task": task_id, "type": t, "from_status": f, "to_status": to, "version": v}
            for t, f, to, v in new.history
        )
    return {"tasks": _json(tasks), "events": _json(events), **FIXED_PARAMS}


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # what orjson does not take (an integer beyond 64 bits in a request's params)
        return json.dumps(value, separators=(",", ":"))


async def create_many_on_loop(pool: Any, engine: Engine, news: Sequence[NewTask]) -> dict[Any, Task]:
    """The batch statement: the rows created, by task id (a task missing from it found its key taken). Raises
    whatever stopped the statement; then nothing was written."""
    params = _batch_params(news)
    async with pool.connection() as raw:
        failpoint("create.before_commit")
        cur = await raw.execute(_BATCH_SQL, params, prepare=True)
        rows = await cur.fetchall()
        failpoint("create.after_commit")
    if rows:
        wakeup.committed(engine, (wakeup.OUTBOX, wakeup.DISPATCH))
    return {values[0]: Task(*values[:-1]) for values in rows}


class CreateBatcher:
    """`creation.create_on_loop` for one process's event loop, batching the creates that queue while its
    statements run (see the module's docstring). Same results and errors as `create_on_loop`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._waiting: list[tuple[NewTask, asyncio.Future[Task | None]]] = []
        #: senders running; counted by the senders themselves, so a create queued as the last one returns is seen
        self._sending = 0
        self._senders: set[asyncio.Task[None]] = set()  # held so they are not collected while running
        #: when each running statement was sent (loop time), by sender
        self._sent_at: dict[int, float] = {}
        #: the loop a look-again is armed on (None: none is): one closed before it fired leaves no stale mark
        self._stall_check: asyncio.AbstractEventLoop | None = None
        #: the requests (asyncio tasks) between `expecting` and their `create`: the creates a sender may wait for
        self._on_the_way: set[asyncio.Task[Any]] = set()
        #: the ones a lingering sender waits for (those on the way when it began to wait, not the ones that came
        #: after: in a closed loop of clients, those are the answered ones' next requests, and waiting for them
        #: would hold every statement for the whole linger); resolved when the last of them arrives (or leaves)
        self._awaited: set[asyncio.Task[Any]] | None = None
        self._all_here: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def expecting(self) -> Iterator[None]:
        """Around a request's way to `create` (its rate limit, its checks): a sender about to send waits up to
        LINGER_S for the creates of such requests, so they share its statement instead of each paying one. A
        request that leaves without creating (refused, or sent to the blocking path) stops being waited for."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._on_the_way.add(task)
        try:
            yield
        finally:
            self._here(task)

    def _here(self, task: asyncio.Task[Any]) -> None:
        self._on_the_way.discard(task)
        awaited = self._awaited
        if awaited is not None and task in awaited:
            awaited.discard(task)
            if not awaited and self._all_here is not None:
                _resolve(self._all_here)

    async def create(self, pool: Any, new: NewTask) -> Task | None:
        future: asyncio.Future[Task | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((new, future))
        task = asyncio.current_task()
        if task is not None:
            self._here(task)
        self._start_sender(pool)
        return await future

    def _start_sender(self, pool: Any) -> None:
        """A sender if none runs; a second one if the running statement has taken STALLED_S, or else a look again
        once it would have."""
        if not self._waiting or self._sending >= MAX_IN_FLIGHT:
            return
        loop = asyncio.get_running_loop()
        running_for = loop.time() - min(self._sent_at.values(), default=loop.time())
        if self._sending and running_for < STALLED_S:
            if self._stall_check is not loop:
                self._stall_check = loop
                loop.call_later(STALLED_S - running_for, self._look_again, pool)
            return
        self._sending += 1
        sender = asyncio.create_task(self._send_waiting(pool))
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    def _look_again(self, pool: Any) -> None:
        self._stall_check = None
        self._start_sender(pool)

    async def _send_waiting(self, pool: Any) -> None:
        me = id(asyncio.current_task())
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                await self._linger(loop)
                batch = self._take()
                self._sent_at[me] = loop.time()
                try:
                    await self._send(pool, batch)
                except BaseException as exc:  # every waiter of the batch hears of it; none is left hanging
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    del self._sent_at[me]
        finally:
            # no await between the last look at the queue and this: a create queued after it starts a sender
            self._sending -= 1

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> None:
        # one sender waits at a time (the other, if any, was started beside a stalled statement: it sends at once)
        if not self._on_the_way or len(self._waiting) >= MAX_BATCH or self._all_here is not None:
            return
        self._awaited = set(self._on_the_way)
        self._all_here = all_here = loop.create_future()
        timer = loop.call_later(LINGER_S, _resolve, all_here)
        try:
            await all_here
        finally:
            timer.cancel()
            self._awaited = self._all_here = None

    def _take(self) -> list[tuple[NewTask, asyncio.Future[Any]]]:
        """Up to MAX_BATCH waiting creates, one per (tenant, key): a twin waits for the next statement, where it
        finds its key taken and replays — two rows for one key in one INSERT would make the statement fail."""
        batch: list[tuple[NewTask, asyncio.Future[Any]]] = []
        rest: list[tuple[NewTask, asyncio.Future[Any]]] = []
        keys: set[tuple[Any, str]] = set()
        for item in self._waiting:
            ident = (item[0].tenant_id, item[0].key)
            if len(batch) < MAX_BATCH and ident not in keys:
                keys.add(ident)
                batch.append(item)
            else:
                rest.append(item)
        self._waiting = rest
        return batch

    async def _send(self, pool: Any, batch: list[tuple[NewTask, asyncio.Future[Any]]]) -> None:
        import psycopg

        CREATE_BATCHES.observe(len(batch))
        if len(batch) == 1:
            await _alone(pool, self._engine, *batch[0])
            return
        try:
            rows = await create_many_on_loop(pool, self._engine, [new for new, _ in batch])
        except psycopg.Error as exc:
            CREATE_BATCH_FALLBACKS.labels(getattr(exc, "sqlstate", None) or "none").inc()
            # a short stripe, a twin in flight, a deadlock or a dropped connection: each create on its own, as if
            # it had never been batched (nothing of the batch was written)
            await asyncio.gather(*(_alone(pool, self._engine, new, future) for new, future in batch))
            return
        for new, future in batch:
            if future.done():  # the request was cancelled; its task stands, and a retry with its key replays it
                continue
            row = rows.get(new.id)
            if row is None:
                future.set_exception(KeyTaken())
            else:
                future.set_result(row)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _alone(pool: Any, engine: Engine, new: NewTask, future: asyncio.Future[Any]) -> None:
    try:
        result = await creation.create_on_loop(pool, engine, new)
    except Exception as exc:  # noqa: BLE001 — handed to the waiting request, which raises it
        if not future.done():
            future.set_exception(exc)
        return
    if not future.done():
        future.set_result(result)
