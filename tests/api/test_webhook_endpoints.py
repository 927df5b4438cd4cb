"""/v1/webhook-endpoints through the HTTP app, in both modes: the secret once, tenant scoping, problem+json."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from tests.support.app import TenantKey, make_context, tenant_with_key

PATH = "/v1/webhook-endpoints"


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    context = make_context(tmp_path / "data", url)
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


def test_create_shows_the_secret_once_and_list_never(ctx: AppContext, client: TestClient) -> None:
    alice = tenant_with_key(ctx, "alice")
    r = client.post(PATH, json={"url": "https://hooks.example.com/a", "events": ["succeeded"]}, headers=alice.headers)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["secret"].startswith("whsec_") and created["events"] == ["SUCCEEDED"]
    assert r.headers["location"] == f"{PATH}/{created['id']}" and r.headers["cache-control"] == "no-store"

    listed = client.get(PATH, headers=alice.headers)
    assert listed.status_code == 200
    assert [e["id"] for e in listed.json()["data"]] == [created["id"]]
    assert "secret" not in listed.json()["data"][0] and created["secret"] not in listed.text
    assert client.get(f"{PATH}/{created['id']}", headers=alice.headers).json()["url"] == "https://hooks.example.com/a"

    rotated = client.post(f"{PATH}/{created['id']}/rotate", headers=alice.headers)
    assert rotated.status_code == 200
    assert rotated.json()["secret"].startswith("whsec_") and rotated.json()["secret"] != created["secret"]
    assert rotated.json()["previous_secret_until"] is not None

    assert client.delete(f"{PATH}/{created['id']}", headers=alice.headers).status_code == 204
    assert client.get(PATH, headers=alice.headers).json()["data"] == []
    assert client.delete(f"{PATH}/{created['id']}", headers=alice.headers).status_code == 404


def test_endpoints_are_tenant_scoped(ctx: AppContext, client: TestClient) -> None:
    alice, bob = tenant_with_key(ctx, "alice"), tenant_with_key(ctx, "bob")
    made = client.post(PATH, json={"url": "https://hooks.example.com/a"}, headers=alice.headers).json()
    ep = made["id"]

    assert client.get(PATH, headers=bob.headers).json()["data"] == []
    for method, path in (("GET", f"{PATH}/{ep}"), ("DELETE", f"{PATH}/{ep}"), ("POST", f"{PATH}/{ep}/rotate")):
        other = str(uuid.uuid4())
        r = client.request(method, path, headers=bob.headers)
        missing = client.request(method, path.replace(ep, other), headers=bob.headers)
        # a foreign endpoint is indistinguishable from a missing one
        assert (r.status_code, missing.status_code) == (404, 404), (method, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"] == missing.json()["type"] and r.json()["type"].endswith("/not-found")
        assert r.json()["detail"].replace(ep, other) == missing.json()["detail"]
    # alice's endpoint is untouched: same secret still current (no rotation happened), still listed
    assert [e["id"] for e in client.get(PATH, headers=alice.headers).json()["data"]] == [ep]
    assert client.get(f"{PATH}/{ep}", headers=alice.headers).json()["previous_secret_until"] is None
    assert client.get(PATH).status_code == 401


def test_bad_input_is_problem_json(ctx: AppContext, client: TestClient) -> None:
    alice: TenantKey = tenant_with_key(ctx, "alice")
    cases = [
        ({"url": "http://127.0.0.1:8080/x"}, "blocked address"),
        ({"url": "http://192.168.1.10/x"}, "private address"),
        ({"url": "ftp://hooks.example.com/x"}, "scheme"),
        ({"url": "https://user:pw@hooks.example.com/x"}, "userinfo"),
        ({"url": "https://hooks.example.com/x", "events": ["DONE"]}, "unknown event 'DONE'"),
    ]
    for body, words in cases:
        r = client.post(PATH, json=body, headers=alice.headers)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert words in r.json()["detail"], (body, r.json())
    assert (
        client.post(PATH, json={"url": "https://a.example/x", "secret": "mine"}, headers=alice.headers).status_code
        == 422
    )
    assert client.get(PATH, headers=alice.headers).json()["data"] == []
