"""POST/GET /v1/generations and cancel, end to end through the HTTP app, in both modes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import credit_ledger, generation_tasks, outbox_events, task_state_events, tenants
from tests.support.app import FakeClock, TenantKey, make_context, tenant_with_key
from tests.support.balance import balance_of
from tests.support.pump import Pump

BODY = {"prompt": "a red fox running through snow", "model": "local-v1"}


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    context = make_context(tmp_path / "data", url)
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=100)


def post(client: TestClient, who: TenantKey, key: str | None, body: dict) -> object:
    headers = dict(who.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/v1/generations", json=body, headers=headers)


def count(ctx: AppContext, table: sa.Table, *where: object) -> int:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


def balance(ctx: AppContext, tenant_id: object) -> object:
    with ctx.engine.connect() as conn:
        return balance_of(conn, tenant_id)


def test_create_reserves_records_and_queues_in_one_go(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    r = post(client, alice, "k1", {**BODY, "duration_s": 4})
    assert r.status_code == 202, r.text
    task = r.json()
    assert task["status"] == "QUEUED" and task["version"] == 3 and task["progress"] == 0
    assert task["estimated_cost"] == "2.00000000"  # 360p default: 0.5 credits/s × 4 s
    assert r.headers["location"] == f"/v1/generations/{task['id']}"
    assert "idempotent-replayed" not in r.headers
    tid = uuid.UUID(task["id"])
    assert count(ctx, credit_ledger, credit_ledger.c.task_id == tid, credit_ledger.c.entry_type == "RESERVE") == 1
    # no queued-intake hop (the dispatcher scans QUEUED tasks itself): the one row is the QUEUED notification
    with ctx.engine.connect() as conn:
        sent = conn.execute(sa.select(outbox_events).where(outbox_events.c.aggregate_id == tid)).all()
    assert [(r.event_type, r.aggregate_version, r.payload["status"]) for r in sent] == [
        ("task.status.changed", 3, "QUEUED")
    ]
    with ctx.engine.connect() as conn:
        history = conn.execute(
            sa.select(task_state_events.c.to_status, task_state_events.c.task_version)
            .where(task_state_events.c.task_id == tid)
            .order_by(task_state_events.c.task_version)
        ).all()
    assert [tuple(h) for h in history] == [("CREATED", 0), ("VALIDATING", 1), ("QUOTA_RESERVED", 2), ("QUEUED", 3)]
    assert str(balance(ctx, alice.tenant_id)).startswith("98")


def test_same_key_same_request_replays_even_reordered_with_defaults_spelled_out(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    first = post(client, alice, "same", BODY).json()
    spelled = {
        "resolution": "360p",
        "model": "local-v1",
        "aspect_ratio": "16:9",
        "duration_s": 5,
        "prompt": "  a red fox running through snow ",
        "priority": 0,
        "provider": "local",
    }
    again = post(client, alice, "same", spelled)
    assert again.status_code == 202 and again.json()["id"] == first["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert count(ctx, generation_tasks) == 1
    assert count(ctx, credit_ledger, credit_ledger.c.entry_type == "RESERVE") == 1


def test_same_key_different_request_is_409(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    post(client, alice, "k", BODY)
    r = post(client, alice, "k", {**BODY, "prompt": "something else"})
    assert r.status_code == 409
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("idempotency-key-reused")
    assert count(ctx, generation_tasks) == 1


def test_keys_are_scoped_per_tenant(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    bob = tenant_with_key(ctx, "bob", credits=100)
    a = post(client, alice, "shared-key", BODY).json()
    b = post(client, bob, "shared-key", {**BODY, "prompt": "bob's own"})
    assert b.status_code == 202 and b.json()["id"] != a["id"]


@pytest.mark.parametrize(
    ("key", "body", "status", "type_end"),
    [
        (None, BODY, 400, "idempotency-key-missing"),
        ("x" * 256, BODY, 400, "idempotency-key-invalid"),
        ("k", {**BODY, "model": "nope"}, 422, "invalid-request"),
        ("k", {**BODY, "duration_s": 11}, 422, "invalid-request"),
        ("k", {**BODY, "duration_s": 0}, 422, "invalid-request"),
        ("k", {**BODY, "resolution": "8k"}, 422, "invalid-request"),
        ("k", {**BODY, "provider": "runway"}, 422, "invalid-request"),
        ("k", {**BODY, "surprise": 1}, 422, "invalid-request"),
        ("k", {"model": "local-v1"}, 422, "invalid-request"),
        ("k", {**BODY, "priority": 1000}, 422, "invalid-request"),
    ],
)
def test_bad_requests_are_problems_and_leave_nothing_behind(
    ctx: AppContext, client: TestClient, alice: TenantKey, key: str | None, body: dict, status: int, type_end: str
) -> None:
    r = post(client, alice, key, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["type"].endswith(type_end) and problem["status"] == status
    assert "Traceback" not in r.text and "sqlalchemy" not in r.text.lower()
    assert count(ctx, generation_tasks) == 0 and count(ctx, credit_ledger, credit_ledger.c.entry_type == "RESERVE") == 0


def test_insufficient_credits_is_402_with_no_task_and_no_ledger_row(ctx: AppContext, client: TestClient) -> None:
    poor = tenant_with_key(ctx, "poor", credits=1)
    r = post(client, poor, "k", {**BODY, "duration_s": 5})  # needs 2.5
    assert r.status_code == 402 and r.json()["type"].endswith("insufficient-credits")
    assert count(ctx, generation_tasks) == 0
    assert count(ctx, credit_ledger, credit_ledger.c.entry_type == "RESERVE") == 0
    assert str(balance(ctx, poor.tenant_id)).startswith("1")


def test_assets_must_be_ready_and_the_tenants_own(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    from aivedio_engine.clock import new_id
    from aivedio_engine.db.tables import assets

    bob = tenant_with_key(ctx, "bob", credits=10)
    now = ctx.clock.now()
    ids = {}
    with ctx.engine.begin() as conn:
        for name, owner, status in (
            ("ready", alice, "READY"),
            ("uploading", alice, "UPLOADING"),
            ("bobs", bob, "READY"),
        ):
            ids[name] = new_id()
            conn.execute(
                assets.insert().values(
                    id=ids[name],
                    tenant_id=owner.tenant_id,
                    kind="INPUT_IMAGE",
                    status=status,
                    bucket="b",
                    object_key=f"k/{name}",
                    created_at=now,
                )
            )
    ok = post(client, alice, "a1", {**BODY, "asset_ids": [str(ids["ready"])]})
    assert ok.status_code == 202, ok.text
    not_ready = post(client, alice, "a2", {**BODY, "asset_ids": [str(ids["uploading"])]})
    assert not_ready.status_code == 422
    foreign = post(client, alice, "a3", {**BODY, "asset_ids": [str(ids["bobs"])]})
    missing = post(client, alice, "a4", {**BODY, "asset_ids": [str(uuid.uuid4())]})
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["title"] == missing.json()["title"]


def test_get_list_and_tenant_isolation(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    bob = tenant_with_key(ctx, "bob", credits=100)
    made = [post(client, alice, f"k{i}", {**BODY, "seed": i}).json()["id"] for i in range(5)]
    got = client.get(f"/v1/generations/{made[0]}", headers=alice.headers)
    assert got.status_code == 200 and got.json()["id"] == made[0]
    foreign = client.get(f"/v1/generations/{made[0]}", headers=bob.headers)
    missing = client.get(f"/v1/generations/{uuid.uuid4()}", headers=bob.headers)
    assert foreign.status_code == missing.status_code == 404
    strip = lambda p: {k: v for k, v in p.items() if k not in ("instance", "request_id", "detail")}  # noqa: E731
    assert strip(foreign.json()) == strip(missing.json())
    assert client.post(f"/v1/generations/{made[0]}/cancel", headers=bob.headers).status_code == 404
    assert client.get("/v1/generations", headers=bob.headers).json()["data"] == []

    page1 = client.get("/v1/generations?limit=2", headers=alice.headers).json()
    page2 = client.get(f"/v1/generations?limit=2&cursor={page1['next_cursor']}", headers=alice.headers).json()
    page3 = client.get(f"/v1/generations?limit=2&cursor={page2['next_cursor']}", headers=alice.headers).json()
    seen = [t["id"] for t in page1["data"] + page2["data"] + page3["data"]]
    assert seen == list(reversed(made)) and page3["next_cursor"] is None
    queued = client.get("/v1/generations?status=QUEUED", headers=alice.headers).json()["data"]
    assert len(queued) == 5
    assert client.get("/v1/generations?status=NOPE", headers=alice.headers).status_code == 422


def test_cancel_before_dispatch_releases_the_reservation(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    task = post(client, alice, "c", BODY).json()
    r = client.post(f"/v1/generations/{task['id']}/cancel", headers=alice.headers)
    assert r.status_code == 202 and r.json()["status"] == "CANCELED" and r.json()["version"] == 4
    again = client.post(f"/v1/generations/{task['id']}/cancel", headers=alice.headers)
    assert again.status_code == 202 and again.json()["version"] == 4  # a repeated cancel changes nothing
    tid = uuid.UUID(task["id"])
    assert count(ctx, credit_ledger, credit_ledger.c.task_id == tid, credit_ledger.c.entry_type == "RELEASE") == 1
    assert str(balance(ctx, alice.tenant_id)).startswith("100")
    with ctx.engine.begin() as conn:  # a finished task cannot be canceled
        conn.execute(generation_tasks.update().values(status="SUCCEEDED"))
    other = post(client, alice, "d", {**BODY, "seed": 7}).json()
    with ctx.engine.begin() as conn:
        conn.execute(
            generation_tasks.update().where(generation_tasks.c.id == uuid.UUID(other["id"])).values(status="SUCCEEDED")
        )
    done = client.post(f"/v1/generations/{other['id']}/cancel", headers=alice.headers)
    assert done.status_code == 409 and done.json()["type"].endswith("illegal-state")


def test_authentication(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer avk_nope"},
        {"Authorization": "Basic abc"},
        {"Authorization": alice.key},
    ):
        r = client.get("/v1/generations", headers=headers)
        assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
    key_id, key = ctx.tenants.create_key(alice.tenant_id)
    assert client.get("/v1/generations", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    ctx.tenants.revoke_key(key_id)
    assert client.get("/v1/generations", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_health_request_id_and_body_cap(client: TestClient, alice: TenantKey) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    r = client.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    assert len(client.get("/healthz").headers["x-request-id"]) == 32
    big = client.post(
        "/v1/generations",
        content=b"{" + b" " * 2_000_000 + b"}",
        headers={**alice.headers, "Idempotency-Key": "big", "Content-Type": "application/json"},
    )
    assert big.status_code == 413
    bad_json = client.post(
        "/v1/generations",
        content=b"{not json",
        headers={**alice.headers, "Idempotency-Key": "j", "Content-Type": "application/json"},
    )
    assert bad_json.status_code == 422 and bad_json.headers["content-type"].startswith("application/problem+json")
    spec = client.get("/openapi.json").json()
    assert "/v1/generations" in spec["paths"] and "/v1/generations/{task_id}/cancel" in spec["paths"]


def test_models_lists_the_catalog(client: TestClient, alice: TenantKey) -> None:
    data = client.get("/v1/models", headers=alice.headers).json()["data"]
    local = next(m for m in data if m["model"] == "local-v1")
    assert local["provider"] == "local" and local["max_duration_s"] == 10
    assert local["price_per_second"] == {"360p": "0.5", "720p": "1"}
    assert client.get("/v1/models").status_code == 401


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[AppContext]:
    """A context whose broker path is stalled: nothing relays the outbox, and the test moves the clock."""
    context = make_context(tmp_path / "stalled", clock=FakeClock(), limits={"shed_exempt_tier": 1})
    yield context
    context.close()


def test_new_work_is_shed_with_503_while_the_outbox_is_stalled_and_resumes_when_it_drains(stalled: AppContext) -> None:
    """: no unbounded acceptance of paid work the broker cannot carry; replays of keys already
    in are still answered, a tier exempted by config is still admitted, and nothing is reserved for a refusal."""
    client = TestClient(create_app(stalled))
    alice, vip = tenant_with_key(stalled, "alice", credits=100), tenant_with_key(stalled, "vip", credits=100)
    with stalled.engine.begin() as conn:
        conn.execute(tenants.update().where(tenants.c.id == vip.tenant_id).values(priority_tier=1))
    assert post(client, alice, "k1", BODY).status_code == 202
    stalled.clock.advance(299)  # type: ignore[attr-defined]
    assert post(client, alice, "k2", BODY).status_code == 202  # due for 299 s: not yet
    stalled.clock.advance(2)  # type: ignore[attr-defined]
    shed_before = REGISTRY.get_sample_value("aivedio_creates_shed_total") or 0.0
    balance_before = balance(stalled, alice.tenant_id)

    r = post(client, alice, "k3", BODY)
    assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "30" and r.json()["type"].endswith("/overloaded")
    assert "waited 301 s" in r.json()["detail"]
    assert REGISTRY.get_sample_value("aivedio_creates_shed_total") == shed_before + 1
    assert balance(stalled, alice.tenant_id) == balance_before  # nothing reserved for the refusal
    assert count(stalled, generation_tasks, generation_tasks.c.client_idempotency_key == "k3") == 0
    replay = post(client, alice, "k1", BODY)
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    assert post(client, vip, "v1", BODY).status_code == 202  # tier 1 ≤ shed_exempt_tier

    Pump(stalled, stop_at_fetch=True).run()  # the broker path moves again: every due row is handed over
    stalled.clock.advance(1)  # type: ignore[attr-defined]
    assert post(client, alice, "k3", BODY).status_code == 202


def test_shedding_can_be_turned_off(tmp_path: Path) -> None:
    context = make_context(tmp_path / "off", clock=FakeClock(), limits={"shed_outbox_age_s": 0})
    try:
        client = TestClient(create_app(context))
        alice = tenant_with_key(context, "alice", credits=100)
        assert post(client, alice, "k1", BODY).status_code == 202
        context.clock.advance(3600)  # type: ignore[attr-defined]
        assert post(client, alice, "k2", BODY).status_code == 202
    finally:
        context.close()
