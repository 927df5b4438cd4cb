"""An Idempotency-Key is the header value without the optional whitespace around it (RFC 9110 §5.5), and then
printable ASCII (`^[!-~]([ -~]*[!-~])?$`): `k`, `k `, `k<TAB>` and ` k` are one key — one task, one RESERVE — and
a key with a byte outside printable ASCII is a 400 saying which, with nothing created (a Latin-1 byte goes over a
plain socket: the test client would re-encode it as UTF-8).

Creates are sent both through the fast path (`api/fast_create.py`, which reads the raw header bytes itself) and
through FastAPI's route (the fast path switched off by never finding a cached key), and also to a real uvicorn
server, whose parser (httptools) keeps trailing whitespace; the query form and POST /v1/projects follow the rule.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api import fast_create
from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks, projects
from tests.support.app import TenantKey, free_port, make_context, running_api, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 1}
#: one key, sent with the optional whitespace a client or a proxy may leave around it
SAME_KEY = [b"k", b"k ", b"k\t", b" k", b" \tk \t"]
#: (header bytes, what the 400 must say)
NOT_KEYS = [
    pytest.param("café".encode(), "character 4 (0xC3) is not ASCII", id="utf8"),
    pytest.param("cafe\u0301".encode(), "character 5 (0xCC) is not ASCII", id="nfd"),
    pytest.param(b"k\x01x", "character 2 is the control character 0x01", id="control"),
    pytest.param(b"k\tx", "character 2 is the control character 0x09", id="inner-tab"),
    pytest.param(b"k" * 256, "256 characters long; at most 255", id="too-long"),
]


@pytest.fixture
def ctx(tmp_path: Path, pg_url: str) -> Iterator[AppContext]:
    context = make_context(tmp_path / "data", pg_url)
    try:
        yield context
    finally:
        context.close()


class Creates:
    """A tenant whose creates go through one path (`fast` or `route`), counting the keys the fast path read."""

    def __init__(self, ctx: AppContext, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ctx = ctx
        self._fast = self.count_fast_keys(monkeypatch)
        if mode == "route":
            monkeypatch.setattr(fast_create.FastCreate, "_principal", lambda self, headers: None)
        self.client = TestClient(create_app(ctx))
        self.who = tenant_with_key(ctx, mode, credits=1000)
        # a first request: the route authenticates the bearer key and caches it, so the fast path knows it
        assert self.post(b"warm").status_code == 202
        self._fast.clear()

    @property
    def fast(self) -> int:
        return len(self._fast)

    @staticmethod
    def count_fast_keys(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
        """The keys the fast path reads from now on (it reads one for each create it answers)."""
        read: list[Any] = []
        real = fast_create.checked_key

        def counting(raw: Any) -> str:
            read.append(raw)
            return real(raw)

        monkeypatch.setattr(fast_create, "checked_key", counting)
        return read

    def post(self, key: bytes) -> httpx.Response:
        headers = {**self.who.headers, "Idempotency-Key": key, "Content-Type": "application/json"}  # type: ignore[dict-item]
        return self.client.post("/v1/generations", json=BODY, headers=headers)


@pytest.fixture(params=["fast", "route"])
def creates(request: pytest.FixtureRequest, ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> Creates:
    return Creates(ctx, request.param, monkeypatch)


def _tasks(ctx: AppContext, who: TenantKey) -> dict[str, Any]:
    """client key → task id, for the tenant's tasks"""
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.select(generation_tasks.c.client_idempotency_key, generation_tasks.c.id).where(
                generation_tasks.c.tenant_id == who.tenant_id
            )
        )
        return {r.client_idempotency_key: r.id for r in rows}


def _reserves(ctx: AppContext, who: TenantKey) -> int:
    with ctx.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(credit_ledger)
                .where(credit_ledger.c.tenant_id == who.tenant_id, credit_ledger.c.entry_type == "RESERVE")
            ).scalar_one()
        )


def test_whitespace_around_the_key_is_not_part_of_it(creates: Creates, request: pytest.FixtureRequest) -> None:
    answers = [creates.post(key) for key in SAME_KEY]
    assert [r.status_code for r in answers] == [202] * len(SAME_KEY), [r.text for r in answers]
    assert {r.json()["id"] for r in answers} == {answers[0].json()["id"]}
    assert [r.headers.get("idempotent-replayed") for r in answers] == [None] + ["true"] * (len(SAME_KEY) - 1)
    tasks = _tasks(creates.ctx, creates.who)
    assert set(tasks) == {"warm", "k"}
    assert _reserves(creates.ctx, creates.who) == 2  # the warm-up's and k's: one charge for the five sends
    assert creates.fast == (len(SAME_KEY) if "fast" in request.node.name else 0)


@pytest.mark.parametrize(("key", "reason"), NOT_KEYS)
def test_a_key_outside_printable_ascii_is_a_400_saying_why(
    creates: Creates, request: pytest.FixtureRequest, key: bytes, reason: str
) -> None:
    r = creates.post(key)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["type"].endswith("/idempotency-key-invalid"), problem
    assert reason in problem["detail"], problem
    assert set(_tasks(creates.ctx, creates.who)) == {"warm"}
    assert _reserves(creates.ctx, creates.who) == 1
    assert creates.fast == (1 if "fast" in request.node.name else 0)


def _send(port: int, bearer: str, key: bytes) -> tuple[int, dict[str, Any]]:
    """POST /v1/generations over a plain socket: an HTTP client library would refuse (h11) or re-encode
    (Starlette's TestClient) the header bytes this must send as they are."""
    payload = json.dumps(BODY).encode()
    head = (
        b"POST /v1/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Authorization: Bearer " + bearer.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Idempotency-Key: " + key + b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


@pytest.mark.parametrize("mode", ["fast", "route"])
def test_a_real_server_keeps_trailing_whitespace_and_the_key_does_not(
    ctx: AppContext, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """uvicorn's parser (httptools) strips the leading whitespace of a value but keeps the trailing; and only a
    socket carries a Latin-1 byte as it is."""
    who = tenant_with_key(ctx, mode, credits=1000)
    fast = Creates.count_fast_keys(monkeypatch)
    if mode == "route":
        monkeypatch.setattr(fast_create.FastCreate, "_principal", lambda self, headers: None)
    port = free_port()
    with running_api(ctx, port):
        # the second round goes through the fast path unless it is switched off: the bearer key is cached by then
        sent = [_send(port, who.key, key) for key in SAME_KEY * 2]
        bad = [_send(port, who.key, key) for key in ("café".encode(), "café".encode("latin-1"))]
    assert [status for status, _ in sent] == [202] * len(sent), sent
    assert {body["id"] for _, body in sent} == {sent[0][1]["id"]}
    assert set(_tasks(ctx, who)) == {"k"}
    assert _reserves(ctx, who) == 1
    assert [status for status, _ in bad] == [400, 400], bad
    assert "character 4 (0xC3) is not ASCII" in bad[0][1]["detail"], bad
    assert "character 4 (0xE9) is not ASCII" in bad[1][1]["detail"], bad
    assert set(_tasks(ctx, who)) == {"k"}
    if mode == "fast":  # every create after the first (which authenticated the bearer key), this one included
        assert len(fast) >= len(SAME_KEY) + len(bad) and fast[-2:] == ["café".encode(), "café".encode("latin-1")]
        assert b"k " in fast and b"k \t" in fast, fast  # what the server's parser left of the value
    else:
        assert fast == []


def test_the_query_form_follows_the_same_rule(creates: Creates) -> None:
    made = creates.post(b"k").json()["id"]
    for value in ["k", "k ", "\tk"]:
        page = creates.client.get("/v1/generations", params={"idempotency_key": value}, headers=creates.who.headers)
        assert page.status_code == 200, page.text
        assert [t["id"] for t in page.json()["data"]] == [made]
    for value, reason in [("café", "character 4 (0xE9) is not ASCII"), ("k\x00", "control character 0x00")]:
        r = creates.client.get("/v1/generations", params={"idempotency_key": value}, headers=creates.who.headers)
        assert r.status_code == 400, r.text
        assert r.json()["type"].endswith("/idempotency-key-invalid") and reason in r.json()["detail"], r.text


def _photo(ctx: AppContext, who: TenantKey) -> str:
    asset_id = new_id()
    with ctx.engine.begin() as conn:
        conn.execute(
            assets.insert().values(
                id=asset_id,
                tenant_id=who.tenant_id,
                kind="INPUT_IMAGE",
                status="READY",
                bucket="b",
                object_key=f"k/{asset_id}",
                created_at=ctx.clock.now(),
            )
        )
    return str(asset_id)


def test_the_projects_route_follows_the_same_rule(ctx: AppContext) -> None:
    client = TestClient(create_app(ctx))
    who = tenant_with_key(ctx, "projects", credits=1000)
    body = {
        "workflow": "photo_story",
        "user_ref": "u-1",
        "input": {"photo_asset_id": _photo(ctx, who), "script": "A walk."},
    }

    def post(key: bytes) -> httpx.Response:
        return client.post("/v1/projects", json=body, headers={**who.headers, "Idempotency-Key": key})  # type: ignore[dict-item]

    answers = [post(key) for key in SAME_KEY]
    assert [r.status_code for r in answers] == [201] * len(SAME_KEY), [r.text for r in answers]
    assert {r.json()["id"] for r in answers} == {answers[0].json()["id"]}
    for key, reason in [("café".encode(), "character 4 (0xC3) is not ASCII"), (b"k\x01", "control character 0x01")]:
        r = post(key)
        assert r.status_code == 400, r.text
        assert r.json()["type"].endswith("/idempotency-key-invalid") and reason in r.json()["detail"], r.text
    with ctx.engine.connect() as conn:
        keys = conn.execute(sa.select(projects.c.idempotency_key).where(projects.c.tenant_id == who.tenant_id))
        assert [k for (k,) in keys] == ["k"]
