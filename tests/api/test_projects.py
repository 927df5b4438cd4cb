"""/v1/projects end to end through the HTTP app: idempotent create (20 concurrent identical POSTs → one project on
PostgreSQL), tenant isolation, cancel, the retry entry of a step, and the SSE stream of a project.

Steps are driven with `ctx.workflows.claim/report_*` directly, as a worker would report them.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, projects
from aivedio_engine.domain.workflow import ErrorCode
from tests.support.app import TenantKey, make_context, running_api, tenant_with_key

ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]
READ_TIMEOUT_S = 10.0


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    # a heartbeat far beyond the read timeout: a stream event can only arrive in time if the change signal woke it
    context = make_context(tmp_path / "data", url, api={"sse_heartbeat_s": 60.0})
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=100)


def photo(ctx: AppContext, who: TenantKey, status: str = "READY") -> str:
    asset_id = new_id()
    with ctx.engine.begin() as conn:
        conn.execute(
            assets.insert().values(
                id=asset_id,
                tenant_id=who.tenant_id,
                kind="INPUT_IMAGE",
                status=status,
                bucket="b",
                object_key=f"k/{asset_id}",
                created_at=ctx.clock.now(),
            )
        )
    return str(asset_id)


def body(photo_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "workflow": "photo_story",
        "user_ref": "user-1",
        "input": {"photo_asset_id": photo_id, "script": "A morning. A walk."},
        **extra,
    }


def post(client: TestClient, who: TenantKey, key: str | None, payload: dict[str, Any]) -> httpx.Response:
    headers = dict(who.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/v1/projects", json=payload, headers=headers)


def count_projects(ctx: AppContext) -> int:
    with ctx.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(projects)).scalar_one())


def finish_due(ctx: AppContext, shots: int = 1) -> list[str]:
    claimed = ctx.workflows.claim(ALL_QUEUES, limit=50)
    for s in claimed:
        ctx.workflows.report_success(s.id, output_json={"shots": shots} if s.step_key == "plan" else {"ok": True})
    return [s.step_key for s in claimed]


def test_create_replay_and_conflicts(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    pid = photo(ctx, alice)
    r = post(client, alice, "p1", body(pid))
    assert r.status_code == 201, r.text
    project = r.json()
    assert project["status"] == "created" and project["workflow"] == "photo_story" and project["priority"] == 3
    # estimated up front: two one-second clips at the local model's 0.5 credits/s; nothing spent yet
    assert (project["cost_estimate"], project["cost_actual"]) == ("1.00000000", "0.00000000")
    assert r.headers["location"] == f"/v1/projects/{project['id']}"
    assert "idempotent-replayed" not in r.headers
    assert [(s["key"], s["status"], s["queue"]) for s in project["steps"]] == [
        ("photo_check", "pending", "photo_check")
    ]

    again = post(client, alice, "p1", body(pid))
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == project["id"]

    other = post(client, alice, "p1", body(pid, user_ref="user-2"))
    assert other.status_code == 409 and other.json()["type"].endswith("/idempotency-key-reused")
    assert count_projects(ctx) == 1

    # a request may ask for a worse tier, never a better one than its tenant's (2 by default)
    tiers = [post(client, alice, f"t{p}", body(pid, priority=p)).json()["priority"] for p in (1, 4)]
    assert tiers == [2, 4]

    missing = post(client, alice, None, body(pid))
    assert missing.status_code == 400 and missing.json()["type"].endswith("/idempotency-key-missing")

    # one open formal project per end user
    first = post(client, alice, "f1", body(pid, formal=True, user_ref="u9"))
    assert first.status_code == 201, first.text
    busy = post(client, alice, "f2", body(pid, formal=True, user_ref="u9"))
    assert busy.status_code == 409 and busy.json()["type"].endswith("/user-project-open")
    assert count_projects(ctx) == 4


def test_bad_input_is_a_problem_naming_the_field(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    pid = photo(ctx, alice)
    cases = {
        "unknown workflow": (body(pid, workflow="nope"), "workflow"),
        "priority out of range": (body(pid, priority=9), "priority"),
        "empty script": ({**body(pid), "input": {"photo_asset_id": pid, "script": ""}}, "script"),
        "photo not ready": (body(photo(ctx, alice, status="UPLOADING")), "photo_asset_id"),
        "photo unknown": (body(str(uuid.uuid4())), "photo_asset_id"),
    }
    for i, (name, (payload, field)) in enumerate(cases.items()):
        r = post(client, alice, f"bad{i}", payload)
        assert r.status_code == 422, (name, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in r.json()["detail"], (name, r.json())
    assert count_projects(ctx) == 0
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"type": "integer", "minimum": 1, "maximum": 5} in schema["ProjectRequest"]["properties"]["priority"][
        "anyOf"
    ]
    assert schema["ProjectInput"]["properties"]["script"]["maxLength"] == 4000


def test_another_tenants_project_is_404(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    bob = tenant_with_key(ctx, "bob")
    created = post(client, alice, "p1", body(photo(ctx, alice))).json()
    url = f"/v1/projects/{created['id']}"
    assert client.get(url, headers=alice.headers).status_code == 200
    for method, path in (
        ("GET", url),
        ("POST", url + "/cancel"),
        ("POST", url + "/steps/photo_check/retry"),
        ("GET", url + "/events"),
    ):
        r = client.request(method, path, headers=bob.headers)
        assert r.status_code == 404 and r.json()["type"].endswith("/not-found"), (method, path, r.text)
    assert client.get("/v1/projects", headers=bob.headers).json()["data"] == []
    # bob's photo cannot be used by alice either
    assert post(client, alice, "p2", body(photo(ctx, bob))).status_code == 422


def test_list_pages_newest_first(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    pid = photo(ctx, alice)
    ids = [post(client, alice, f"k{i}", body(pid)).json()["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/projects", params=params, headers=alice.headers).json()
        seen += [p["id"] for p in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert client.get("/v1/projects?limit=0", headers=alice.headers).status_code == 422


def test_get_shows_steps_with_durations_costs_errors_and_the_retry_entry(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    created = post(client, alice, "p1", body(photo(ctx, alice))).json()
    url = f"/v1/projects/{created['id']}"
    assert finish_due(ctx) == ["photo_check"]
    (plan,) = ctx.workflows.claim(["text"])
    ctx.workflows.report_failure(plan.id, ErrorCode.INPUT_INVALID, "the script has no sentence")
    project = client.get(url, headers=alice.headers).json()
    assert project["status"] == "failed"
    steps = {s["key"]: s for s in project["steps"]}
    assert steps["photo_check"]["status"] == "success" and steps["photo_check"]["duration_s"] is not None
    failed = steps["plan"]
    assert (failed["status"], failed["error_code"], failed["error_message"]) == (
        "failed",
        "INPUT_INVALID",
        "the script has no sentence",
    )
    assert failed["links"]["retry"] == f"{url}/steps/plan/retry"

    # the retry entry: same row, back to pending, the project runs again
    r = client.post(failed["links"]["retry"], headers=alice.headers)
    assert r.status_code == 200, r.text
    steps = {s["key"]: s for s in r.json()["steps"]}
    assert steps["plan"]["status"] == "pending" and r.json()["status"] == "running"
    # a step that did not fail cannot be retried: 409 naming its status
    again = client.post(f"{url}/steps/photo_check/retry", headers=alice.headers)
    assert again.status_code == 409 and "success" in again.json()["detail"]
    assert client.post(f"{url}/steps/nope/retry", headers=alice.headers).status_code == 404
    assert client.post(f"{url}/steps/BAD KEY/retry", headers=alice.headers).status_code == 422


def test_cancel_cancels_open_steps_and_repeats_harmlessly(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    created = post(client, alice, "p1", body(photo(ctx, alice))).json()
    url = f"/v1/projects/{created['id']}"
    r = client.post(url + "/cancel", headers=alice.headers)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert [s["status"] for s in r.json()["steps"]] == ["cancelled"]
    assert client.post(url + "/cancel", headers=alice.headers).json()["status"] == "cancelled"
    assert ctx.workflows.claim(ALL_QUEUES) == []  # nothing left to run


@pytest.mark.postgres
def test_twenty_concurrent_identical_posts_make_one_project(pg_url: str, tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", pg_url)
    try:
        alice = tenant_with_key(ctx, "alice")
        payload = body(photo(ctx, alice), formal=True)
        with running_api(ctx) as base:
            gate = threading.Barrier(20)

            def one(_: int) -> httpx.Response:
                gate.wait(READ_TIMEOUT_S)
                return httpx.post(
                    base + "/v1/projects",
                    json=payload,
                    headers={**alice.headers, "Idempotency-Key": "same"},
                    timeout=READ_TIMEOUT_S,
                )

            with ThreadPoolExecutor(20) as pool:
                answers = list(pool.map(one, range(20)))
        assert [r.status_code for r in answers] == [201] * 20, [r.text for r in answers if r.status_code != 201]
        assert len({r.json()["id"] for r in answers}) == 1
        assert sum(r.headers.get("idempotent-replayed") == "true" for r in answers) == 19
        assert count_projects(ctx) == 1
    finally:
        ctx.close()


class Sse:
    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.iter_lines()

    def next(self) -> dict[str, Any]:
        """The next event (pings skipped) as {"id", "event", "data"}."""
        event: dict[str, Any] = {}
        for line in self.lines:
            if line.startswith(":"):
                continue
            if not line:
                if event:
                    return event
                continue
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value
        raise AssertionError(f"stream ended, partial event {event}")


def test_sse_one_event_per_change_resumable_and_ending_at_terminal(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    created = post(client, alice, "p1", body(photo(ctx, alice))).json()
    url = f"/v1/projects/{created['id']}/events"
    with running_api(ctx) as base:
        with httpx.stream("GET", base + url, headers=alice.headers, timeout=READ_TIMEOUT_S) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            sse = Sse(r)
            first = sse.next()
            assert first["event"] == "snapshot" and first["data"]["status"] == "created" and "id" not in first
            # each move below wakes the stream live (the heartbeat is 60 s, the read timeout 10 s)
            (step,) = ctx.workflows.claim(["photo_check"])
            started = sse.next()
            assert (started["event"], started["id"]) == ("step", "1")
            assert started["data"]["step"] == "photo_check" and started["data"]["status"] == "running"
            moved = sse.next()  # the project followed its first step, in the same transaction
            assert (moved["event"], moved["id"], moved["data"]["from"], moved["data"]["status"]) == (
                "project",
                "2",
                "created",
                "running",
            )
            ctx.workflows.report_success(step.id, output_json={"ok": True})
            done = sse.next()
            assert (done["id"], done["data"]["status"]) == ("3", "success")
            last_seen = done["id"]
        # later changes while nobody listens; a resumed stream gets exactly those, then the end
        for _ in range(20):
            if not finish_due(ctx, shots=1):
                break
        assert client.get(f"/v1/projects/{created['id']}", headers=alice.headers).json()["status"] == "succeeded"
        headers = {**alice.headers, "Last-Event-ID": last_seen}
        with httpx.stream("GET", base + url, headers=headers, timeout=READ_TIMEOUT_S) as r:
            body_text = r.read().decode()
    events = [b for b in body_text.split("\n\n") if b.strip()]
    ids = [int(line[4:]) for b in events for line in b.splitlines() if line.startswith("id: ")]
    # 10 more steps (started + succeeded each) and the project's running → succeeded; no snapshot on a resume
    assert ids == list(range(4, 4 + 2 * 10 + 1)) and len(events) == len(ids)
    assert "event: project" in events[-1] and '"status":"succeeded"' in events[-1]  # last; then the stream ended
