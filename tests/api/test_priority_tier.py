"""A request's `priority` is the tier it asks for, capped by its tenant's tier (1 is served first)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.domain import admission
from aivedio_engine.services.operations import Operation
from tests.support.app import TenantKey, make_context, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 1}


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AppContext]:
    # no cache between `tenants update` and the next request, as if api.auth_cache_ttl_s had passed
    context = make_context(tmp_path / "data", api={"auth_cache_ttl_s": 0})
    yield context
    context.close()


def test_priority_is_capped_by_the_tenant_tier_and_the_dispatcher_serves_tier_1_first(ctx: AppContext) -> None:
    client = TestClient(create_app(ctx))
    paid, vip = tenant_with_key(ctx, "paid"), tenant_with_key(ctx, "vip")
    ctx.tenants.update_limits(vip.tenant_id, {"priority_tier": 1}, Operation("tenants update", "test"))

    def create(who: TenantKey, key: str, **extra: object) -> dict[str, Any]:
        r = client.post("/v1/generations", json={**BODY, **extra}, headers={**who.headers, "Idempotency-Key": key})
        assert r.status_code == 202, r.text
        return r.json()

    assert create(paid, "p-none")["priority"] == 2  # absent: the tenant's tier
    asked_better = create(paid, "p-1", priority=1)
    assert asked_better["priority"] == 2 and asked_better["params"]["priority"] == 1  # capped; the ask is kept
    assert create(paid, "p-4", priority=4)["priority"] == 4  # a worse tier may be asked for
    assert create(vip, "v-none")["priority"] == 1
    bad = client.post("/v1/generations", json={**BODY, "priority": 6}, headers={**paid.headers, "Idempotency-Key": "x"})
    assert bad.status_code == 422 and bad.json()["type"].endswith("/invalid-request")
    # the same request again is a replay, whatever the cap made of it
    again = client.post(
        "/v1/generations", json={**BODY, "priority": 1}, headers={**paid.headers, "Idempotency-Key": "p-1"}
    )
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"

    def tiers() -> dict[str, int]:
        cands, _ = ctx.dispatcher._candidates(ctx.clock.now(), 100)
        keys = {str(t.id): k for k, t in created.items()}
        return {keys[c.task_id]: c.tier for c in cands}

    created = {
        k: ctx.generations.find_by_key(w.tenant_id, k)
        for w, k in [(paid, "p-none"), (paid, "p-1"), (paid, "p-4"), (vip, "v-none")]
    }
    assert tiers() == {"p-none": 2, "p-1": 2, "p-4": 4, "v-none": 1}
    # admission serves the strict tiers in order: vip's task first although it is the newest
    cands, _ = ctx.dispatcher._candidates(ctx.clock.now(), 100)
    limits = admission.Limits(platform=1, tenant_default=10, providers={"local": 10})
    (first,) = admission.select(cands, {}, limits, max_picks=1).picks
    assert first.task_id == str(created["v-none"].id)  # type: ignore[union-attr]

    # a tenant moved to a worse tier takes its queued tasks with it
    ctx.tenants.update_limits(paid.tenant_id, {"priority_tier": 3}, Operation("tenants update", "test"))
    assert tiers() == {"p-none": 3, "p-1": 3, "p-4": 4, "v-none": 1}
