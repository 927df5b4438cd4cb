"""POST /v1/generations served on the event loop (`services/loop_create.py`), against PostgreSQL and Redis.

With the app's lifespan running (as uvicorn runs it), a create whose checks are all cached never leaves the loop:
it takes no worker thread. Everything that needs a blocking step goes to the thread and still answers the same:
a replay, a reused key, a short balance stripe, a refusal for credits, a cold tenant, reference assets. The rate
limit's token is taken once per request whichever path finishes it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import credit_ledger, generation_tasks, outbox_events, task_state_events
from aivedio_engine.services import loop_create
from tests.support.app import FakeClock, TenantKey, distributed_context, make_context, tenant_with_key
from tests.support.balance import balance_of
from tests.support.redis import private_prefix

pytestmark = pytest.mark.postgres

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 1}


@pytest.fixture
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    yield from distributed_context(tmp_path / "data", request.getfixturevalue("pg_url"), "loop-create")


class Threads:
    """Counts the creates that went to a worker thread (the blocking path)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = loop_create.run_in_threadpool

        async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real(func, *args, **kwargs)

        monkeypatch.setattr(loop_create, "run_in_threadpool", counting)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> Threads:
    return Threads(monkeypatch)


def post(client: TestClient, who: TenantKey, key: str, body: dict[str, Any] | None = None) -> Any:
    return client.post("/v1/generations", json=body or BODY, headers={**who.headers, "Idempotency-Key": key})


def count(ctx: AppContext, table: sa.Table, *where: Any) -> int:
    with ctx.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def balance(ctx: AppContext, tenant_id: uuid.UUID) -> Decimal:
    with ctx.engine.connect() as conn:
        return balance_of(conn, tenant_id)


def ledger_sum(ctx: AppContext, tenant_id: uuid.UUID) -> Decimal:
    with ctx.engine.connect() as conn:
        total = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(credit_ledger.c.amount), 0)).where(
                credit_ledger.c.tenant_id == tenant_id
            )
        ).scalar_one()
    return Decimal(total)


def test_a_warm_tenants_create_never_leaves_the_loop_and_writes_every_row(ctx: AppContext, threads: Threads) -> None:
    who = tenant_with_key(ctx, "alice", credits=1000)
    with TestClient(create_app(ctx)) as client:
        assert post(client, who, "warm").status_code == 202  # a cold tenant: its limits are read in the thread
        before = threads.calls
        r = post(client, who, "k1")
        assert r.status_code == 202, r.text
        assert threads.calls == before  # served on the loop
    task_id = uuid.UUID(r.json()["id"])
    assert r.headers["location"] == f"/v1/generations/{task_id}"
    assert r.json()["status"] == "QUEUED" and r.json()["version"] == 3
    cost = Decimal(r.json()["estimated_cost"])
    # the same rows as the blocking create: 4 state events, the RESERVE, the QUEUED notice, the balance
    assert count(ctx, task_state_events, task_state_events.c.task_id == task_id) == 4
    assert count(ctx, credit_ledger, credit_ledger.c.task_id == task_id, credit_ledger.c.entry_type == "RESERVE") == 1
    assert count(ctx, outbox_events, outbox_events.c.aggregate_id == task_id) == 1
    assert balance(ctx, who.tenant_id) == Decimal(1000) - 2 * cost == ledger_sum(ctx, who.tenant_id)


def test_replays_and_a_reused_key_answer_on_the_loop_as_in_the_thread(ctx: AppContext, threads: Threads) -> None:
    who = tenant_with_key(ctx, "alice", credits=1000)
    with TestClient(create_app(ctx)) as client:
        first = post(client, who, "k1")
        before = threads.calls
        again = post(client, who, "k1")
        other = post(client, who, "k1", {**BODY, "prompt": "another prompt"})
        assert threads.calls == before
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409 and other.json()["type"].endswith("idempotency-key-reused"), other.text
    assert count(ctx, generation_tasks, generation_tasks.c.tenant_id == who.tenant_id) == 1


def test_a_short_stripe_goes_to_the_thread_and_draws_on_the_whole_balance(ctx: AppContext, threads: Threads) -> None:
    who = tenant_with_key(ctx, "alice", credits=1000)
    with TestClient(create_app(ctx)) as client:
        cost = Decimal(post(client, who, "price").json()["estimated_cost"])
        # leave 3 tasks' worth spread over 64 stripes: no single stripe covers one task
        poor = tenant_with_key(ctx, "bob", credits=3 * cost)
        # an unknown model is refused after the token (its limits now cached), before any write
        assert post(client, poor, "warm", {**BODY, "model": "no-such-model"}).status_code == 422
        before = threads.calls
        answers = [post(client, poor, f"b{i}") for i in range(4)]
        went_to_thread = threads.calls - before
    assert [a.status_code for a in answers] == [202, 202, 202, 402], [a.text for a in answers]
    assert answers[3].json()["type"].endswith("insufficient-credits")
    assert Decimal(answers[3].json()["needed"]) == cost
    assert went_to_thread >= 3  # every short stripe (and the refusal) finished in the thread
    assert balance(ctx, poor.tenant_id) == 0 == ledger_sum(ctx, poor.tenant_id)
    assert count(ctx, generation_tasks, generation_tasks.c.tenant_id == poor.tenant_id) == 3


def test_the_rate_limit_takes_one_token_per_request_on_either_path(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    for prefix in private_prefix("loop-create-rate"):
        ctx = make_context(
            tmp_path / "data",
            request.getfixturevalue("pg_url"),
            mode="distributed",
            redis={"key_prefix": prefix},
            api={"tenant_rate_limit_per_s": 0.001, "tenant_rate_burst": 3},
        )
        try:
            who = tenant_with_key(ctx, "alice", credits=1000)
            missing = str(uuid.uuid4())
            with TestClient(create_app(ctx)) as client:
                cold = post(client, who, "k1")  # limits not cached: the thread takes the token
                assets = post(client, who, "k2", {**BODY, "asset_ids": [missing]})  # token on the loop, then thread
                warm = post(client, who, "k3")  # on the loop
                refused = post(client, who, "k4")
        finally:
            ctx.close()
    assert cold.status_code == 202, cold.text
    assert assets.status_code == 404 and missing in assets.json()["detail"], assets.text
    assert warm.status_code == 202, warm.text
    assert refused.status_code == 429 and refused.json()["type"].endswith("rate-limited"), refused.text
    assert int(refused.headers["retry-after"]) >= 1


def test_without_the_lifespan_every_create_takes_the_thread(ctx: AppContext, threads: Threads) -> None:
    who = tenant_with_key(ctx, "alice", credits=1000)
    client = TestClient(create_app(ctx))  # no `with`: the loop pool is never opened
    answers = [post(client, who, f"k{i}") for i in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert threads.calls == 3


def test_a_backlog_read_on_the_loop_sheds_new_work_there_too(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The loop reads the backlog signal itself once its cached reading is a second old; during a backlog it never
    admits new work (the thread answers 503, reading the tier), and a key already in is still replayed."""
    for prefix in private_prefix("loop-create-shed"):
        ctx = make_context(
            tmp_path / "data",
            request.getfixturevalue("pg_url"),
            clock=FakeClock(),
            mode="distributed",
            redis={"key_prefix": prefix},
        )
        try:
            who = tenant_with_key(ctx, "alice", credits=1000)
            with TestClient(create_app(ctx)) as client:
                assert post(client, who, "k1").status_code == 202  # nothing relays the outbox from here on
                ctx.clock.advance(299)  # type: ignore[attr-defined]
                assert post(client, who, "k2").status_code == 202  # due for 299 s: not yet (limits read again)
                ctx.clock.advance(2)  # the backlog reading is stale, the tenant's limits are not
                shed = post(client, who, "k3")
                replay = post(client, who, "k1")
            assert count(ctx, generation_tasks, generation_tasks.c.client_idempotency_key == "k3") == 0
        finally:
            ctx.close()
    assert shed.status_code == 503 and shed.json()["type"].endswith("/overloaded"), shed.text
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
