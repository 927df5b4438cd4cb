"""`POST /v1/generations` holds a request to the chosen model's reference, duration and ratio limits before anything
is reserved, and `GET /v1/models` shows those limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from tests.support.api_requests import create, nothing_reserved, ready_input
from tests.support.app import TenantKey, make_context, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 2}
#: a second provider whose models have vendor limits (never called: nothing gets past create)
KLING = {
    "adapter": "kling",
    "base_url": "https://kling.test",
    "models": {"kling-v2-master": {"max_duration_s": 10, "resolutions": ["720p"], "price_per_second": {"720p": "1"}}},
}


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    context = make_context(
        tmp_path / "data",
        url,
        providers={
            "local": {
                "adapter": "local",
                "allow_http_origin": True,
                "output_hosts": ["127.0.0.1"],
                "models": {
                    "local-v1": {
                        "max_duration_s": 10,
                        "resolutions": ["360p", "720p"],
                        "price_per_second": {"360p": "0.5", "720p": "1"},
                    }
                },
            },
            "kling": KLING,
        },
    )
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=100)


def test_too_many_references_is_422_naming_the_limit_and_reserves_nothing(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    two = [ready_input(ctx, alice), ready_input(ctx, alice)]
    r = create(client, alice, "two-images", {**BODY, "asset_ids": two})
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert "model local-v1 accepts at most 1 reference image (got 2)" in r.json()["detail"]
    video = ready_input(ctx, alice, kind="INPUT_VIDEO")
    r = create(client, alice, "a-video", {**BODY, "asset_ids": [video]})
    assert r.status_code == 422 and "model local-v1 accepts no reference video (got 1)" in r.json()["detail"]
    nothing_reserved(ctx, alice)
    # the same key with a request that fits is a new, accepted request: the refusal stored nothing
    ok = create(client, alice, "two-images", {**BODY, "asset_ids": two[:1]})
    assert ok.status_code == 202, ok.text


def test_size_ratio_and_duration_limits_of_a_vendor_model(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    kling = {**BODY, "model": "kling-v2-master", "provider": "kling", "duration_s": 5}
    big = ready_input(ctx, alice, size_bytes=11 * 1024 * 1024, width=1280, height=720)
    r = create(client, alice, "big", {**kling, "asset_ids": [big]})
    assert r.status_code == 422 and "model kling-v2-master accepts at most 10.0 MB" in r.json()["detail"]
    strip = ready_input(ctx, alice, size_bytes=1000, width=3000, height=1000)
    r = create(client, alice, "strip", {**kling, "asset_ids": [strip]})
    assert r.status_code == 422 and "width/height 3.00" in r.json()["detail"]
    r = create(client, alice, "long", {**kling, "duration_s": 7})
    assert r.status_code == 422
    assert "duration 7 s not allowed for kling-v2-master (allowed: 5, 10)" in r.json()["detail"]
    r = create(client, alice, "square", {**kling, "aspect_ratio": "4:3"})
    assert r.status_code == 422 and "aspect ratio 4:3 not allowed for kling-v2-master" in r.json()["detail"]
    nothing_reserved(ctx, alice)


def test_models_show_their_limits(client: TestClient, alice: TenantKey) -> None:
    data = {m["model"]: m for m in client.get("/v1/models", headers=alice.headers).json()["data"]}
    assert data["local-v1"]["limits"]["max_reference_images"] == 1
    assert data["local-v1"]["limits"]["max_reference_videos"] == 0
    k = data["kling-v2-master"]
    assert k["aspect_ratios"] == ["16:9", "9:16", "1:1"] and k["default_duration_s"] == 5
    assert k["limits"]["durations_s"] == [5, 10] and k["limits"]["max_image_bytes"] == 10 * 1024 * 1024
    assert k["limits"]["reference_image_ratio"] == [0.4, 2.5]
