"""Creation under concurrency on real PostgreSQL: one task per key, no overspending, in-flight keys, DB down."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import credit_ledger, generation_tasks, tenant_balance_stripes
from aivedio_engine.services.errors import InsufficientCredits
from tests.support.app import make_context, running_api, tenant_with_key
from tests.support.balance import balance_of

BODY = {"prompt": "a lighthouse at dusk", "model": "local-v1", "duration_s": 2}  # 1 credit at 360p


@pytest.fixture
def ctx(pg_url: str, tmp_path: Path) -> Iterator[AppContext]:
    context = make_context(tmp_path / "data", pg_url, database={"url": pg_url, "pool_size": 20})
    yield context
    context.close()


def test_50_concurrent_identical_posts_make_one_task_and_one_reservation(ctx: AppContext) -> None:
    who = tenant_with_key(ctx, "alice", credits=100)
    headers = {**who.headers, "Idempotency-Key": "storm-1"}
    barrier = threading.Barrier(50)

    def one(_: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            barrier.wait()
            return client.post(base + "/v1/generations", json=BODY, headers=headers)

    with running_api(ctx) as base, ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(one, range(50)))
    assert {r.status_code for r in responses} == {202}, {r.status_code: r.text for r in responses}
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in responses) == 49
    with ctx.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(generation_tasks)).scalar_one() == 1
        assert (
            conn.execute(
                sa.select(sa.func.count()).select_from(credit_ledger).where(credit_ledger.c.entry_type == "RESERVE")
            ).scalar_one()
            == 1
        )


def _create_from_8_threads(
    ctx: AppContext, tenant_id: Any, prefix: str, per_thread: int, watch: Callable[[], Decimal] | None = None
) -> tuple[list[str], list[Decimal]]:
    """8 threads, released together, each creating `per_thread` tasks of 1 credit: "ok" or "402" per create, and
    `watch()` read after each one."""
    outcomes: list[str] = []
    watched: list[Decimal] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            try:
                ctx.generations.create(tenant_id, f"{prefix}{n}-{i}", dict(BODY))
                result = "ok"
            except InsufficientCredits:
                result = "402"
            value = watch() if watch is not None else None
            with lock:
                outcomes.append(result)
                if value is not None:
                    watched.append(value)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return outcomes, watched


def test_8_threads_reserving_against_a_balance_for_10_tasks(ctx: AppContext) -> None:
    who = tenant_with_key(ctx, "tight", credits=10)  # exactly 10 tasks of 1 credit

    def balance() -> Decimal:
        with ctx.engine.connect() as conn:
            return balance_of(conn, who.tenant_id)

    outcomes, balances_seen = _create_from_8_threads(ctx, who.tenant_id, "t", 5, watch=balance)
    assert outcomes.count("ok") == 10 and outcomes.count("402") == 30
    assert min(balances_seen) >= 0
    with ctx.engine.connect() as conn:
        final = balance_of(conn, who.tenant_id)
        ledger_sum = conn.execute(
            sa.select(sa.func.sum(credit_ledger.c.amount)).where(credit_ledger.c.tenant_id == who.tenant_id)
        ).scalar_one()
    assert final == 0 and ledger_sum == 0


def test_reservations_over_striped_balance_rows_neither_overspend_nor_strand_credits(ctx: AppContext) -> None:
    """The balance lives in 16 stripes (db/balances.py): most creations take from their own stripe, a short one
    draws on all of them. 8 threads × 20 creations of 1 credit against 100: exactly 100 succeed, no stripe ever
    goes below zero, and nothing is left over (a credit stranded on a stripe would refuse a creation that the
    balance as a whole covers)."""
    who = tenant_with_key(ctx, "striped", credits=100)
    outcomes, _ = _create_from_8_threads(ctx, who.tenant_id, "s", 20)
    assert (outcomes.count("ok"), outcomes.count("402")) == (100, 60)
    with ctx.engine.connect() as conn:
        stripes = conn.execute(
            sa.select(tenant_balance_stripes.c.balance).where(tenant_balance_stripes.c.tenant_id == who.tenant_id)
        ).scalars()
        assert all(b >= 0 for b in stripes)
        assert balance_of(conn, who.tenant_id) == 0


def test_a_key_still_being_created_is_409_in_flight(ctx: AppContext, pg_dsn: str) -> None:
    from fastapi.testclient import TestClient

    from aivedio_engine.api.app import create_app

    who = tenant_with_key(ctx, "alice", credits=10)
    with psycopg.connect(pg_dsn) as holder:  # plays the first request, mid-transaction: its row is not committed
        holder.execute(
            "INSERT INTO generation_tasks (id, tenant_id, client_idempotency_key, request_hash, status, "
            "requested_model, estimated_cost, prompt, params, created_at, updated_at) "
            "VALUES (gen_random_uuid(), %s, 'slow', '\\x00', 'QUEUED', 'sim-v1', 1, 'p', '{}', now(), now())",
            (who.tenant_id,),
        )
        r = TestClient(create_app(ctx)).post(
            "/v1/generations", json=BODY, headers={**who.headers, "Idempotency-Key": "slow"}
        )
        holder.rollback()
    assert r.status_code == 409 and r.json()["type"].endswith("idempotency-key-in-flight")


class _Blackhole:
    """Accepts TCP connections and never answers: a database that hangs instead of refusing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("failure", ["refused", "hangs"])
def test_database_down_means_503_within_2s_never_202(tmp_path: Path, failure: str) -> None:
    from fastapi.testclient import TestClient

    from aivedio_engine.api.app import create_app
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.config import load_settings

    hole = _Blackhole()
    port = hole.port
    if failure == "refused":
        hole.close()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere"
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path), "database": {"url": url}}))
    client = TestClient(create_app(ctx))
    try:
        started = time.monotonic()
        r = client.post("/v1/generations", json=BODY, headers={"Authorization": "Bearer avk_x", "Idempotency-Key": "k"})
        elapsed = time.monotonic() - started
        assert r.status_code == 503 and r.json()["type"].endswith("database-unavailable"), r.text
        assert elapsed < 2.0, elapsed
        ready = client.get("/readyz")
        assert ready.status_code == 503
    finally:
        hole.close()
        ctx.close()
