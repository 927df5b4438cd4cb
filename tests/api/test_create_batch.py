"""Creates sent several to a statement (`db/creation_batch.py`), against PostgreSQL and Redis.

Concurrent POSTs on one event loop, as uvicorn serves them: while a statement of the process runs, the creates
that arrive wait for the next one and go together, and a sender about to send waits briefly for the creates
already on their way (`CreateBatcher.expecting`). Every answer and every row must be what one statement
per create gives: a task per key, its four state events, the RESERVE, the notice, the balance equal to the ledger
— and a batch that cannot commit as a whole (a short stripe) falls back to one create at a time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db import creation_batch
from aivedio_engine.db.tables import credit_ledger, generation_tasks, outbox_events, task_state_events
from tests.support.app import TenantKey, distributed_context, tenant_with_key
from tests.support.balance import balance_of

pytestmark = pytest.mark.postgres

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 1}


@pytest.fixture
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    yield from distributed_context(tmp_path / "data", request.getfixturevalue("pg_url"), "create-batch")


class Batches:
    """The sizes of the batch statements sent (a create sent alone does not count)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        real = creation_batch.create_many_on_loop

        async def counting(pool: Any, engine: Any, news: Any) -> Any:
            self.sizes.append(len(news))
            return await real(pool, engine, news)

        monkeypatch.setattr(creation_batch, "create_many_on_loop", counting)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Batches:
    return Batches(monkeypatch)


def storm(ctx: AppContext, requests: list[tuple[TenantKey, str]], warm: list[TenantKey]) -> list[httpx.Response]:
    """Each tenant of `warm` creates once (so its limits are cached), then every request is sent at once."""

    async def run() -> list[httpx.Response]:
        await ctx.loop_create.open()  # what the app's lifespan does under uvicorn
        try:
            transport = httpx.ASGITransport(app=create_app(ctx))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:

                def post(who: TenantKey, key: str) -> Any:
                    headers = {**who.headers, "Idempotency-Key": key}
                    return client.post("/v1/generations", json=BODY, headers=headers)

                for who in warm:
                    assert (await post(who, "warm")).status_code == 202
                return list(await asyncio.gather(*(post(who, key) for who, key in requests)))
        finally:
            await ctx.loop_create.close()

    return asyncio.run(run())


def count(ctx: AppContext, table: sa.Table, *where: Any) -> int:
    with ctx.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def money(ctx: AppContext, tenant_id: uuid.UUID) -> tuple[Decimal, Decimal]:
    """(balance, sum of the tenant's ledger)"""
    with ctx.engine.connect() as conn:
        ledger = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(credit_ledger.c.amount), 0)).where(
                credit_ledger.c.tenant_id == tenant_id
            )
        ).scalar_one()
        return balance_of(conn, tenant_id), Decimal(ledger)


def assert_whole(ctx: AppContext, task_id: uuid.UUID) -> None:
    assert count(ctx, task_state_events, task_state_events.c.task_id == task_id) == 4
    assert count(ctx, credit_ledger, credit_ledger.c.task_id == task_id, credit_ledger.c.entry_type == "RESERVE") == 1
    assert count(ctx, outbox_events, outbox_events.c.aggregate_id == task_id) == 1


def test_concurrent_creates_of_two_tenants_go_several_to_a_statement_and_write_every_row(
    ctx: AppContext, batches: Batches
) -> None:
    alice = tenant_with_key(ctx, "alice", credits=1000)
    bob = tenant_with_key(ctx, "bob", credits=1000)
    answers = storm(ctx, [(who, f"k{i}") for i in range(20) for who in (alice, bob)], warm=[alice, bob])
    assert [a.status_code for a in answers] == [202] * 40, [a.text for a in answers if a.status_code != 202]
    assert not any("idempotent-replayed" in a.headers for a in answers)
    assert max(batches.sizes, default=0) > 1, batches.sizes  # some creates did share a statement
    assert sum(batches.sizes) <= 40
    ids = {uuid.UUID(a.json()["id"]) for a in answers}
    assert len(ids) == 40
    for task_id in ids:
        assert_whole(ctx, task_id)
    cost = Decimal(answers[0].json()["estimated_cost"])
    for who in (alice, bob):
        assert count(ctx, generation_tasks, generation_tasks.c.tenant_id == who.tenant_id) == 21
        assert money(ctx, who.tenant_id) == (Decimal(1000) - 21 * cost,) * 2


def test_the_same_key_sent_many_times_at_once_makes_one_task_and_replays_it(ctx: AppContext, batches: Batches) -> None:
    alice = tenant_with_key(ctx, "alice", credits=1000)
    requests = [(alice, "twin")] * 50 + [(alice, f"k{i}") for i in range(12)]
    answers = storm(ctx, requests, warm=[alice])
    assert [a.status_code for a in answers] == [202] * 62, [a.text for a in answers if a.status_code != 202]
    twins = answers[:50]
    assert len({a.json()["id"] for a in twins}) == 1
    assert sum("idempotent-replayed" not in a.headers for a in twins) == 1  # one made it, 49 replayed it
    assert count(ctx, generation_tasks, generation_tasks.c.client_idempotency_key == "twin") == 1
    assert max(batches.sizes, default=0) > 1, batches.sizes
    cost = Decimal(answers[0].json()["estimated_cost"])
    assert money(ctx, alice.tenant_id) == (Decimal(1000) - 14 * cost,) * 2


def test_a_batch_its_stripes_cannot_cover_falls_back_to_one_create_at_a_time(ctx: AppContext, batches: Batches) -> None:
    """Credits for 4 tasks spread over every stripe: no batch statement can commit (each refuses for its stripes'
    sum), so each create runs alone and ends as it would have: 4 are made from the whole balance, the rest are
    402, and the balance never goes below zero."""
    rich = tenant_with_key(ctx, "rich", credits=1000)
    price = storm(ctx, [], warm=[rich])  # nothing but the warm-up: it tells the price
    assert price == []
    with ctx.engine.connect() as conn:
        cost = Decimal(conn.execute(sa.select(generation_tasks.c.estimated_cost)).scalar_one())
    poor = tenant_with_key(ctx, "poor", credits=5 * cost)  # the warm-up takes one
    answers = storm(ctx, [(poor, f"p{i}") for i in range(12)], warm=[poor])
    codes = sorted(a.status_code for a in answers)
    assert codes == [202] * 4 + [402] * 8, [a.text for a in answers]
    assert all(a.json()["type"].endswith("insufficient-credits") for a in answers if a.status_code == 402)
    assert max(batches.sizes, default=0) > 1, batches.sizes  # batches were tried, and refused as a whole
    assert money(ctx, poor.tenant_id) == (Decimal(0), Decimal(0))
    assert count(ctx, generation_tasks, generation_tasks.c.tenant_id == poor.tenant_id) == 5
    for a in answers:
        if a.status_code == 202:
            assert_whole(ctx, uuid.UUID(a.json()["id"]))


def test_a_create_waiting_on_a_lock_does_not_hold_up_the_other_creates_of_its_process(
    ctx: AppContext, pg_url: str
) -> None:
    """A twin's key held by another transaction keeps one statement waiting (up to the lock timeout); the next
    create of the same process goes out beside it once it has waited STALLED_S, and answers first."""
    import psycopg

    alice = tenant_with_key(ctx, "alice", credits=1000)
    # an earlier event loop served this process's batcher first (as each TestClient context does): whatever it left
    # behind must not keep the second statement from going out on this one
    assert all(a.status_code == 202 for a in storm(ctx, [(alice, f"before{i}") for i in range(24)], warm=[alice]))
    conninfo = pg_url.replace("postgresql+psycopg://", "postgresql://")
    holder = psycopg.connect(conninfo)
    watcher = psycopg.connect(conninfo, autocommit=True)  # a fresh view of pg_stat_activity on every read
    order: list[str] = []

    async def run() -> tuple[httpx.Response, httpx.Response]:
        await ctx.loop_create.open()
        try:
            transport = httpx.ASGITransport(app=create_app(ctx))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:

                async def post(key: str) -> httpx.Response:
                    headers = {**alice.headers, "Idempotency-Key": key}
                    response = await client.post("/v1/generations", json=BODY, headers=headers)
                    order.append(key)
                    return response

                assert (await post("warm-again")).status_code == 202
                # another transaction holds the key "held" (as a twin's create in another process would)
                holder.execute(
                    "INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status,"
                    " requested_model, estimated_cost, prompt, params, created_at, updated_at)"
                    " VALUES (%s, %s, 'held', '\\x00', 'QUEUED', 'local-v1', 0, 'p', '{}', now(), now())",
                    (uuid.uuid4(), alice.tenant_id),
                )
                stuck = asyncio.create_task(post("held"))
                while not _waiting_on_a_lock(watcher):  # the create's statement now waits for the holder
                    await asyncio.sleep(0.01)
                free = await post("free")
                assert not stuck.done()  # still waiting on the lock when the other create was answered
                holder.rollback()  # the twin went away: the waiting create takes the key
                return await stuck, free
        finally:
            await ctx.loop_create.close()

    try:
        stuck, free = asyncio.run(run())
    finally:
        holder.close()
        watcher.close()
    assert free.status_code == 202, free.text
    assert stuck.status_code == 202, stuck.text
    assert order[-2:] == ["free", "held"]
    assert count(ctx, generation_tasks, generation_tasks.c.tenant_id == alice.tenant_id) == 1 + 24 + 3


def _waiting_on_a_lock(conn: Any) -> bool:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return bool(cur.fetchone()[0])


class OnTheWay:
    """Requests on one loop as `LoopCreate` runs them: each inside `expecting` from its start, held at a gate where
    the real one awaits its rate-limit token, then planned and created."""

    def __init__(self, ctx: AppContext, who: TenantKey) -> None:
        self.ctx, self.who = ctx, who
        self.gates: dict[str, asyncio.Event] = {}

    def start(self, key: str, *, held: bool = False, creates: bool = True) -> asyncio.Task[Any]:
        gate = self.gates[key] = asyncio.Event()
        if not held:
            gate.set()
        return asyncio.create_task(self._request(key, gate, creates))

    async def _request(self, key: str, gate: asyncio.Event, creates: bool) -> Any:
        generations, pool = self.ctx.generations, self.ctx.loop_pool.current()
        with generations.expecting():
            await gate.wait()
            if not creates:  # refused, or sent to the blocking path: it leaves without a create
                return None
            new = await generations.plan_on_loop(pool, self.who.tenant_id, key, dict(BODY))
            assert new is not None
            return await generations.insert_on_loop(pool, new)

    async def queued(self, n: int) -> None:
        """Until `n` creates wait in the batcher's queue (a plan reads the database, so this takes real time)."""
        batcher = self.ctx.create_batcher
        async with asyncio.timeout(10):
            while len(batcher._waiting) < n:
                await asyncio.sleep(0.001)


def on_the_way(ctx: AppContext, scenario: Any) -> None:
    alice = tenant_with_key(ctx, "alice", credits=1000)
    storm(ctx, [], warm=[alice])  # the tenant's limits and tier cached, as on a warm API process

    async def run() -> None:
        await ctx.loop_create.open()
        try:
            await scenario(OnTheWay(ctx, alice))
        finally:
            await ctx.loop_create.close()

    asyncio.run(run())


def test_a_sender_waits_for_the_creates_already_on_their_way_and_sends_them_in_one_statement(
    ctx: AppContext, batches: Batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(creation_batch, "LINGER_S", 60.0)  # only the arrival can end the wait here

    async def scenario(way: OnTheWay) -> None:
        second = way.start("second", held=True)
        first = way.start("first")
        await way.queued(1)
        for _ in range(10):  # the sender has every chance to send "first" alone: it must not
            await asyncio.sleep(0)
        assert not first.done() and batches.sizes == []
        way.gates["second"].set()
        async with asyncio.timeout(10):
            made = await asyncio.gather(first, second)
        assert batches.sizes == [2]
        assert all(m is not None and not m.replayed for m in made)

    on_the_way(ctx, scenario)
    assert count(ctx, generation_tasks, generation_tasks.c.client_idempotency_key.in_(["first", "second"])) == 2


def test_a_request_that_leaves_without_creating_ends_the_wait(
    ctx: AppContext, batches: Batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(creation_batch, "LINGER_S", 60.0)

    async def scenario(way: OnTheWay) -> None:
        refused = way.start("refused", held=True, creates=False)
        first = way.start("first")
        await way.queued(1)
        assert not first.done()
        way.gates["refused"].set()
        async with asyncio.timeout(10):
            assert await first is not None
        assert await refused is None
        assert batches.sizes == []  # sent alone, as soon as nobody was left on the way

    on_the_way(ctx, scenario)


def test_requests_that_start_while_a_sender_waits_are_not_waited_for(
    ctx: AppContext, batches: Batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a closed loop of clients, the answered requests' next ones start while a sender waits: waiting for them
    too would hold each statement for the whole linger."""
    monkeypatch.setattr(creation_batch, "LINGER_S", 60.0)

    async def scenario(way: OnTheWay) -> None:
        second = way.start("second", held=True)
        first = way.start("first")
        await way.queued(1)
        for _ in range(10):
            await asyncio.sleep(0)
        later = way.start("later", held=True)  # begins while the sender waits for "second"
        way.gates["second"].set()
        async with asyncio.timeout(10):
            await asyncio.gather(first, second)
        assert batches.sizes == [2] and not later.done()
        way.gates["later"].set()
        async with asyncio.timeout(10):
            assert await later is not None

    on_the_way(ctx, scenario)


def test_a_create_on_its_way_for_longer_than_the_linger_is_not_waited_for(
    ctx: AppContext, batches: Batches, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(creation_batch, "LINGER_S", 0.05)

    async def scenario(way: OnTheWay) -> None:
        slow = way.start("slow", held=True)  # a rate-limit token that takes long to come
        first = way.start("first")
        async with asyncio.timeout(10):
            assert await first is not None
        assert not slow.done() and batches.sizes == []
        way.gates["slow"].set()
        async with asyncio.timeout(10):
            assert await slow is not None

    on_the_way(ctx, scenario)
