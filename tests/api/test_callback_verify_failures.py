"""A provider callback that fails verification is answered 401 and leaves a trace: a row with the reason, the
counter `aivedio_callback_verify_failures_total{provider,reason}`, and past `alerts.callback_verify_failures` in
one window an alert for the provider. Nothing of the request reaches the event store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.config import ModelSettings, ProviderSettings, _default_providers
from aivedio_engine.db.tables import alerts, callback_rejections, provider_events
from aivedio_engine.providers.webhooks import sign_webhook
from tests.support.app import make_context
from tests.support.sim import SECRET

BODY = b'{"id":"job_x","status":"succeeded","event_id":"evt_1"}'
LIMIT = 3


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
    context = make_context(
        tmp_path / "data",
        url,
        providers={**_default_providers(), "sim": sim},
        alerts={"callback_verify_failures": LIMIT, "callback_verify_window_s": 600},
    )
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx), raise_server_exceptions=False)


def signed(msg_id: str, ts: int, body: bytes = BODY) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), **sign_webhook([SECRET], msg_id, ts, body)}


def failures(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("aivedio_callback_verify_failures_total", {"provider": "sim", "reason": reason})
        or 0.0
    )


def rejections(ctx: AppContext) -> dict[str, int]:
    r = callback_rejections.c
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.reason, sa.func.sum(r.failures)).where(r.provider == "sim").group_by(r.reason)
        ).all()
    return {reason: int(n) for reason, n in rows}


def callback_alerts(ctx: AppContext) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(alerts).where(alerts.c.rule == "callback_verify_failures")))


def test_a_callback_failing_verification_is_recorded_with_its_reason_and_counted(
    ctx: AppContext, client: TestClient
) -> None:
    now = int(ctx.clock.now().timestamp())
    forged = {**signed("msg_1", now), "webhook-signature": "v1,AAAA"}
    stale = signed("msg_2", now - 3600)
    before = {reason: failures(reason) for reason in ("signature", "timestamp", "malformed")}

    answers = [
        client.post("/v1/callbacks/sim", content=BODY, headers=forged),
        client.post("/v1/callbacks/sim", content=BODY, headers={}),  # unsigned
        client.post("/v1/callbacks/sim", content=BODY, headers=stale),
    ]

    assert [a.status_code for a in answers] == [401, 401, 401]
    assert all(a.headers["content-type"].startswith("application/problem+json") for a in answers)
    assert rejections(ctx) == {"signature": 2, "timestamp": 1}
    assert failures("signature") == before["signature"] + 2
    assert failures("timestamp") == before["timestamp"] + 1
    assert failures("malformed") == before["malformed"]
    r = callback_rejections.c
    with ctx.engine.connect() as conn:
        details = {row.reason: row.detail for row in conn.execute(sa.select(r.reason, r.detail))}
        stored = conn.execute(sa.select(sa.func.count()).select_from(provider_events)).scalar_one()
    assert details == {"signature": "missing webhook-id header", "timestamp": "webhook-timestamp too old"}
    assert stored == 0
    # a verified callback is not a failure
    ok = client.post("/v1/callbacks/sim", content=BODY, headers=signed("msg_3", int(time.time())))
    assert ok.status_code == 200 and rejections(ctx) == {"signature": 2, "timestamp": 1}


def test_past_the_configured_rate_the_provider_gets_an_alert(ctx: AppContext, client: TestClient) -> None:
    forged = {**signed("msg_1", int(ctx.clock.now().timestamp())), "webhook-signature": "v1,AAAA"}
    for _ in range(LIMIT - 1):
        assert client.post("/v1/callbacks/sim", content=BODY, headers=forged).status_code == 401
    ctx.alert_evaluator.evaluate_now()
    assert callback_alerts(ctx) == []  # below the rate: counted, not alerted

    assert client.post("/v1/callbacks/sim", content=BODY, headers=forged).status_code == 401
    ctx.alert_evaluator.evaluate_now()

    [alert] = callback_alerts(ctx)
    assert (alert.subject_type, alert.subject_id, alert.status) == ("provider", "sim", "OPEN")
    assert f"{LIMIT} callbacks" in alert.message and "signature" in alert.message
