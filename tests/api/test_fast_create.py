"""The create route's fast path (`api/fast_create.py`) answers exactly as the route does.

The same requests go once through the fast path and once, for another tenant, through FastAPI's route (the fast
path switched off by never finding a cached key); status, headers and body must match once ids and timestamps
are set aside — for a create, a replay, each refusal, and the requests the fast path hands on to the route.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from aivedio_engine.api import fast_create
from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from tests.support.app import TenantKey, make_context, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 1}
#: fields that differ between any two answers (ids, times, the request id)
VOLATILE = {
    "id",
    "created_at",
    "updated_at",
    "deadline_at",
    "request_id",
    "location",
    "x-request-id",
    "instance",
    "links",
}


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AppContext]:
    context = make_context(tmp_path / "data")
    try:
        yield context
    finally:
        context.close()


class Served:
    """Counts the creates the fast path answered itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fast = 0
        real = fast_create.accept

        async def counting(*args: Any, **kwargs: Any) -> Any:
            self.fast += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(fast_create, "accept", counting)


def scenario(client: TestClient, who: TenantKey, cost: Decimal) -> list[Any]:
    def post(key: str | None, body: Any = BODY, **headers: str) -> Any:
        sent = {**who.headers, **headers, **({"Idempotency-Key": key} if key is not None else {})}
        if isinstance(body, bytes):
            return client.post("/v1/generations", content=body, headers=sent)
        return client.post("/v1/generations", json=body, headers=sent)

    return [
        post("k1"),  # made
        post("k1"),  # replayed
        post("k1", {**BODY, "prompt": "another prompt"}),  # 409: the key was used with another request
        post(None),  # 400: no key
        post("k2", {**BODY, "colour": "red"}),  # 422: an unknown field (handed on)
        post("k3", b'{"prompt": ', **{"Content-Type": "application/json"}),  # 422: not JSON (handed on)
        post("k4", b"prompt=fox", **{"Content-Type": "text/plain"}),  # another content type (handed on)
        post("k5", {**BODY, "model": "no-such-model"}),  # 422 from the service
        post("k6"),  # 402: the credits are gone
    ]


def shape(response: Any) -> tuple[Any, ...]:
    headers = {k: v for k, v in response.headers.items() if k not in VOLATILE}
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in VOLATILE}
    return response.status_code, headers, body


def test_the_fast_path_answers_as_the_route_does(ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served(monkeypatch)
    with TestClient(create_app(ctx)) as client:
        probe = tenant_with_key(ctx, "probe", credits=1000)
        cost = Decimal(
            client.post("/v1/generations", json=BODY, headers={**probe.headers, "Idempotency-Key": "p"}).json()[
                "estimated_cost"
            ]
        )
        answers = {}
        for mode in ("fast", "route"):
            who = tenant_with_key(ctx, mode, credits=2 * cost)
            if mode == "route":  # no key is ever found cached: every request goes to FastAPI's route
                monkeypatch.setattr(fast_create.FastCreate, "_principal", lambda self, headers: None)
            warm = client.post("/v1/generations", json=BODY, headers={**who.headers, "Idempotency-Key": "warm"})
            assert warm.status_code == 202  # a first request: the route authenticates the key and caches it
            before = served.fast
            answers[mode] = scenario(client, who, cost)
            served_fast = served.fast - before
            if mode == "fast":
                assert served_fast == 6  # made, replayed, the 409, the 400, the service's 422 and the 402
            else:
                assert served_fast == 0
    fast, route = answers["fast"], answers["route"]
    assert [r.status_code for r in fast] == [202, 202, 409, 400, 422, 422, 422, 422, 402], [r.text for r in fast]
    for mine, theirs in zip(fast, route, strict=True):
        assert shape(mine) == shape(theirs)
    assert fast[1].headers["idempotent-replayed"] == "true"
    assert fast[0].headers["location"] == f"/v1/generations/{fast[0].json()['id']}"
    assert fast[0].headers["x-request-id"]
