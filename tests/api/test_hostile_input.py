"""Hostile input at the edge: each case is a 4xx problem (or, for a signed callback, a stored rejection), never a
5xx, and a rejected request leaves no task, ledger row or outbox row behind. Run on both databases: SQLite
stores a NUL happily, PostgreSQL refuses it at the driver, so only the edge can give the same answer on both."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.config import ModelSettings, ProviderSettings, _default_providers
from aivedio_engine.db.tables import credit_ledger, generation_tasks, outbox_events, provider_events
from aivedio_engine.providers.webhooks import sign_webhook
from tests.support.app import TenantKey, make_context, tenant_with_key
from tests.support.sim import SECRET

BODY = {"prompt": "a red fox running through snow", "model": "local-v1"}


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    # a sim provider that is never called: only its callback verification is used here
    sim = ProviderSettings(
        adapter="sim",
        base_url="http://127.0.0.1:9",
        allow_http_origin=True,
        webhook_secrets=[SECRET],
        models={"sim-v1": ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": 1})},
    )
    context = make_context(tmp_path / "data", url, providers={**_default_providers(), "sim": sim})
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx), raise_server_exceptions=False)


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=1000)


def effects(ctx: AppContext) -> tuple[int, int, int]:
    with ctx.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (generation_tasks, credit_ledger, outbox_events)
        )


def assert_problem(r: object, status: int) -> None:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    assert r.headers["content-type"].startswith("application/problem+json")  # type: ignore[attr-defined]


def raw_post(client: TestClient, who: TenantKey, body: bytes, key: str = "k") -> object:
    headers = {**who.headers, "Idempotency-Key": key, "Content-Type": "application/json"}
    return client.post("/v1/generations", content=body, headers=headers)


@pytest.mark.parametrize(
    "body",
    [
        {**BODY, "prompt": "a fox\x00 in snow"},
        {**BODY, "model": "local-v1\x00"},
        {**BODY, "provider": "lo\x00cal"},
        {**BODY, "resolution": "360p\x00"},
        {**BODY, "aspect_ratio": "16:9\x00"},
    ],
    ids=["prompt", "model", "provider", "resolution", "aspect_ratio"],
)
def test_nul_in_any_string_field_is_422_and_creates_nothing(
    ctx: AppContext, client: TestClient, alice: TenantKey, body: dict
) -> None:
    before = effects(ctx)
    assert_problem(raw_post(client, alice, json.dumps(body).encode()), 422)
    assert effects(ctx) == before


def test_lone_surrogate_in_the_prompt_is_422(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    before = effects(ctx)
    body = b'{"prompt": "a fox \\ud800 in snow", "model": "local-v1"}'
    assert_problem(raw_post(client, alice, body), 422)
    assert effects(ctx) == before


@pytest.mark.parametrize(
    "params",
    [
        {"status": "QUEUED\x00"},
        {"status": "x" * 10_000},
        {"cursor": "not-a-uuid"},
        {"limit": "99999999999999999999999"},
    ],
)
def test_bad_query_parameters_are_4xx(client: TestClient, alice: TenantKey, params: dict) -> None:
    r = client.get("/v1/generations", params=params, headers=alice.headers)
    assert_problem(r, 422)


@pytest.mark.parametrize("key", ["k\x00", "x" * 256], ids=["nul", "too-long"])
def test_a_bad_key_in_the_query_is_the_key_rules_400(client: TestClient, alice: TenantKey, key: str) -> None:
    r = client.get("/v1/generations", params={"idempotency_key": key}, headers=alice.headers)
    assert_problem(r, 400)
    assert r.json()["type"].endswith("/idempotency-key-invalid")  # type: ignore[attr-defined]


@pytest.mark.parametrize("field", ["duration_s", "seed", "priority", "deadline_s"], ids=lambda f: f"{f}-is-strict")
@pytest.mark.parametrize("value", [True, "2", 4.0], ids=["bool", "str", "float"])
def test_integers_are_strict_no_bool_or_string_coercion(
    ctx: AppContext, client: TestClient, alice: TenantKey, field: str, value: object
) -> None:
    before = effects(ctx)
    assert_problem(raw_post(client, alice, json.dumps({**BODY, field: value}).encode()), 422)
    assert effects(ctx) == before


def test_chunked_body_over_the_cap_is_413_problem(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    cap = ctx.settings.api.max_body_bytes

    def chunks() -> Iterator[bytes]:  # no Content-Length: only the bytes that arrive can tell
        yield b'{"prompt": "'
        for _ in range(10 * 1024 * 1024 // 65536):
            yield b"a" * 65536
        yield b'", "model": "local-v1"}'

    before = effects(ctx)
    headers = {**alice.headers, "Idempotency-Key": "big", "Content-Type": "application/json"}
    r = client.post("/v1/generations", content=chunks(), headers=headers)
    assert_problem(r, 413)
    assert r.json()["type"].endswith("payload-too-large") and cap < 10 * 1024 * 1024
    assert effects(ctx) == before
    # a chunked body under the cap still goes through
    small = client.post(
        "/v1/generations", content=iter([json.dumps(BODY).encode()]), headers={**headers, "Idempotency-Key": "s"}
    )
    assert small.status_code == 202, small.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["99999999999999999999", "9223372036854775808", "-1", "abc", "1e3"])
def test_sse_resume_id_is_validated_before_the_stream_starts(client: TestClient, alice: TenantKey, value: str) -> None:
    created = raw_post(client, alice, json.dumps(BODY).encode())
    task_id = created.json()["id"]  # type: ignore[attr-defined]
    url = f"/v1/generations/{task_id}/events"
    r = client.get(url, headers={**alice.headers, "Last-Event-ID": value})
    assert_problem(r, 422)
    r = client.get(url, params={"last_event_id": value}, headers=alice.headers)
    assert_problem(r, 422)


def _signed(body: dict, msg_id: str) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(body).encode()
    return raw, sign_webhook([SECRET], msg_id, int(time.time()), raw)


@pytest.mark.parametrize(
    "job",
    [
        {"id": "j" * 300, "status": "succeeded"},
        {"id": "job\x00x", "status": "succeeded"},
        {"id": "job_ok", "status": "running", "request_key": "r" * 200},
        {"id": "job_ok", "status": "running", "request_key": "rk\x00"},
        {"id": "job_ok", "status": "failed", "error": {"code": "E\x00", "message": "bad \ud800 thing"}},
    ],
    ids=["long-job-id", "nul-job-id", "long-request-key", "nul-request-key", "nul-in-error"],
)
def test_signed_callback_with_unstorable_fields_is_kept_as_a_rejected_event_not_a_500(
    ctx: AppContext, client: TestClient, job: dict
) -> None:
    msg_id = "msg_" + uuid.uuid4().hex
    raw, headers = _signed(job, msg_id)
    before = effects(ctx)
    r = client.post("/v1/callbacks/sim", content=raw, headers=headers)
    assert r.status_code == 200, r.text  # a 5xx would make the vendor retry it forever
    assert r.json() == {"received": 1, "stored": 0}
    with ctx.engine.connect() as conn:
        row = conn.execute(sa.select(provider_events).where(provider_events.c.webhook_id == msg_id)).one()
    assert row.body == raw and row.verified and not row.orphan and row.matched_attempt_id is None
    assert row.provider_job_id is None and row.observation["rejected"]
    assert effects(ctx) == before  # nothing for the reducer
    # the vendor's retry of the same delivery is the same row, still a 2xx
    again = client.post("/v1/callbacks/sim", content=raw, headers=headers)
    assert again.status_code == 200 and again.json() == {"received": 1, "stored": 0}
    with ctx.engine.connect() as conn:
        n = conn.execute(
            sa.select(sa.func.count()).select_from(provider_events).where(provider_events.c.webhook_id == msg_id)
        ).scalar_one()
    assert n == 1
