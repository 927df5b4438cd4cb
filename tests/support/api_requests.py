"""Requests of the HTTP API's tests: a READY input asset of a tenant, a create with its idempotency key, and the
check that a refused create reserved nothing (no task, no outbox row, no ledger row but adjustments, the balance
untouched at 100)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks, outbox_events
from tests.support.app import TenantKey
from tests.support.balance import balance_of


def ready_input(ctx: AppContext, who: TenantKey, kind: str = "INPUT_IMAGE", **measured: Any) -> str:
    asset_id = new_id()
    with ctx.engine.begin() as conn:
        conn.execute(
            assets.insert().values(
                id=asset_id,
                tenant_id=who.tenant_id,
                kind=kind,
                status="READY",
                bucket="b",
                object_key=f"k/{asset_id}",
                created_at=ctx.clock.now(),
                **measured,
            )
        )
    return str(asset_id)


def nothing_reserved(ctx: AppContext, who: TenantKey) -> None:
    with ctx.engine.connect() as conn:

        def n(table: sa.Table) -> int:
            return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()

        assert n(generation_tasks) == 0 and n(outbox_events) == 0
        assert n(credit_ledger.select().where(credit_ledger.c.entry_type != "ADJUSTMENT").subquery()) == 0
        balance = balance_of(conn, who.tenant_id)
    assert balance == 100


def create(client: TestClient, who: TenantKey, key: str, body: dict[str, Any]) -> Any:
    return client.post("/v1/generations", json=body, headers={**who.headers, "Idempotency-Key": key})
