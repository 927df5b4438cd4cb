"""GET /v1/generations/{id}/events: the real API on a loopback port, the real relay and notify worker behind it.

The heartbeat is set far beyond the read timeout in the flow tests, so an event can only arrive in time if the
`task.status.changed` → relay → `notify_status_changed` → notifier path woke the stream; a broken notifier
makes the read time out instead of passing on the heartbeat's re-read.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db import tasks
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import EventSource
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.services.transition import AfterCommit, Change, decide_and_execute
from aivedio_engine.worker.runtime import Runtime
from tests.contract import wait_until
from tests.support.app import TenantKey, make_context, running_api, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1"}
#: no single read may wait longer than this; far below the flow tests' heartbeat
READ_TIMEOUT_S = 10.0
QUIET_HEARTBEAT_S = 60.0


@dataclass
class Api:
    ctx: AppContext
    base: str
    alice: TenantKey

    def create(self, key: str = "k1") -> str:
        r = httpx.post(
            self.base + "/v1/generations",
            json=BODY,
            headers={**self.alice.headers, "Idempotency-Key": key},
            timeout=READ_TIMEOUT_S,
        )
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    @contextmanager
    def stream(
        self,
        task_id: str,
        who: TenantKey | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Iterator[httpx.Response]:
        with httpx.stream(
            "GET",
            f"{self.base}/v1/generations/{task_id}/events",
            params=params,
            headers={**(who or self.alice).headers, **(headers or {})},
            timeout=httpx.Timeout(READ_TIMEOUT_S),
        ) as r:
            yield r


@contextmanager
def api_with_workers(
    tmp_path: Path,
    *,
    heartbeat_s: float = QUIET_HEARTBEAT_S,
    database_url: str | None = None,
    workers: bool = True,
    **overrides: Any,
) -> Iterator[Api]:
    ctx = make_context(tmp_path / "data", database_url, api={"sse_heartbeat_s": heartbeat_s}, **overrides)
    stop = threading.Event()
    # relay + worker only: no scheduler, so nothing but the test moves a task past QUEUED
    runtime = Runtime(ctx, {"relay", "worker"} if workers else set(), stop)
    runtime.start()
    try:
        with running_api(ctx) as base:
            yield Api(ctx, base, tenant_with_key(ctx, "alice", credits=100))
    finally:
        runtime.shutdown()
        ctx.close()
    assert runtime.failed is None


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with api_with_workers(tmp_path) as a:
        yield a


class SSE:
    """Reads one event stream: dispatched events (dicts with id/event/data) and comment lines."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        self._lines = response.iter_lines()

    def next(self) -> dict[str, Any] | None:
        """The next event or comment ({"comment": text}); None when the server ended the stream."""
        fields: dict[str, Any] = {}
        for line in self._lines:
            if line == "":
                if fields:
                    return fields
                continue
            if line.startswith(":"):
                return {"comment": line[1:].strip()}
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        return fields or None

    def event(self) -> dict[str, Any]:
        item = self.next()
        assert item is not None and "comment" not in item, item
        assert item["event"] == "status"
        data = json.loads(item["data"])
        assert str(data["version"]) == item["id"], "the event id is the task version"
        return data

    def events(self, n: int) -> list[dict[str, Any]]:
        return [self.event() for _ in range(n)]

    def status_version(self) -> tuple[str, int]:
        data = self.event()
        return data["status"], data["version"]


def drive(ctx: AppContext, task_id: str, event: TaskEvent) -> None:
    """Move the task the way a worker would: decide under the row lock, execute, commit."""
    # a retry far in the future: the stream's events come from this test, not from a sweeper
    columns = {"next_retry_at": ctx.clock.now() + timedelta(days=1)} if event is TaskEvent.RETRYABLE_FAILURE else {}
    after = AfterCommit(ctx.engine)
    with write_tx(ctx.engine) as conn:
        task = tasks.read(conn, uuid.UUID(task_id), lock=True)
        decide_and_execute(conn, task, event, Change(EventSource.WORKER, columns=columns), ctx.clock.now(), after)
    after.run()


@pytest.mark.parametrize("mode", ["embedded", pytest.param("distributed", marks=pytest.mark.postgres)])
def test_stream_sends_history_then_each_change_live_and_ends_after_the_terminal_one(
    request: pytest.FixtureRequest, tmp_path: Path, mode: str
) -> None:
    extra: dict[str, Any] = {}
    if mode == "distributed":
        extra = {
            "database_url": request.getfixturevalue("pg_url"),
            "mode": "distributed",
            "redis": {"key_prefix": f"aivedio-test-{uuid.uuid4().hex[:8]}:"},
        }
    with api_with_workers(tmp_path, **extra) as api:
        task_id = api.create()
        with api.stream(task_id) as r:
            sse = SSE(r)
            history = sse.events(4)
            assert [(e["status"], e["version"]) for e in history] == [
                ("CREATED", 0),
                ("VALIDATING", 1),
                ("QUOTA_RESERVED", 2),
                ("QUEUED", 3),
            ]
            assert all(e["id"] == task_id and e["at"] for e in history)
            assert history[-1]["progress"] == 0

            drive(api.ctx, task_id, TaskEvent.RETRYABLE_FAILURE)
            assert sse.status_version() == ("RETRY_WAIT", 4)
            drive(api.ctx, task_id, TaskEvent.RETRY_DUE)
            assert sse.status_version() == ("QUEUED", 5)
            api.ctx.generations.cancel(api.alice.tenant_id, uuid.UUID(task_id))
            assert sse.status_version() == ("CANCELED", 6)
            assert sse.next() is None, "the stream ends after a terminal status"
        # nothing stays subscribed once the stream is over
        wait_until(lambda: api.ctx.notifier.subscribers() == 0, READ_TIMEOUT_S, "the subscription to go")


def test_last_event_id_resumes_after_that_version_header_before_query(api: Api) -> None:
    task_id = api.create()
    with api.stream(task_id, headers={"Last-Event-ID": "2"}) as r:
        sse = SSE(r)
        assert [e["version"] for e in sse.events(1)] == [3]
        drive(api.ctx, task_id, TaskEvent.RETRYABLE_FAILURE)
        assert sse.event()["version"] == 4, "only changes after the resume point, nothing repeated"
    with api.stream(task_id, params={"last_event_id": 1}) as r:
        assert [e["version"] for e in SSE(r).events(3)] == [2, 3, 4]
    with api.stream(task_id, headers={"Last-Event-ID": "3"}, params={"last_event_id": 0}) as r:
        assert [e["version"] for e in SSE(r).events(1)] == [4]


def test_resuming_a_finished_task_after_its_last_event_ends_at_once(api: Api) -> None:
    task_id = api.create()
    api.ctx.generations.cancel(api.alice.tenant_id, uuid.UUID(task_id))
    with api.stream(task_id, headers={"Last-Event-ID": "4"}) as r:
        assert SSE(r).next() is None
    with api.stream(task_id, headers={"Last-Event-ID": "3"}) as r:
        sse = SSE(r)
        assert sse.event()["status"] == "CANCELED"
        assert sse.next() is None


def test_a_stream_closed_by_the_client_releases_its_subscription(api: Api) -> None:
    task_id = api.create()
    with api.stream(task_id) as r:
        sse = SSE(r)  # kept: dropping the line iterator would close the connection early
        sse.events(4)
        assert api.ctx.notifier.subscribers(uuid.UUID(task_id)) == 1
    wait_until(lambda: api.ctx.notifier.subscribers() == 0, READ_TIMEOUT_S, "the subscription to go")


def test_foreign_missing_and_anonymous_requests_get_no_stream(api: Api) -> None:
    task_id = api.create()
    bob = tenant_with_key(api.ctx, "bob")
    for who, tid in ((bob, task_id), (api.alice, str(uuid.uuid4()))):
        r = httpx.get(f"{api.base}/v1/generations/{tid}/events", headers=who.headers, timeout=READ_TIMEOUT_S)
        assert r.status_code == 404, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"].endswith("/not-found")
    assert httpx.get(f"{api.base}/v1/generations/{task_id}/events", timeout=READ_TIMEOUT_S).status_code == 401
    r = httpx.get(
        f"{api.base}/v1/generations/{task_id}/events",
        headers={**api.alice.headers, "Last-Event-ID": "x"},
        timeout=READ_TIMEOUT_S,
    )
    assert r.status_code == 422


def test_an_idle_stream_gets_heartbeats_and_a_missed_signal_is_recovered_by_them(tmp_path: Path) -> None:
    # no relay or worker: no signal is ever sent, as when a Redis reconnect swallows one
    with api_with_workers(tmp_path, heartbeat_s=0.2, workers=False) as api:
        task_id = api.create()
        with api.stream(task_id) as r:
            sse = SSE(r)
            sse.events(4)
            assert sse.next() == {"comment": "ping"}
            drive(api.ctx, task_id, TaskEvent.RETRYABLE_FAILURE)  # its signal never comes; the re-read finds it
            item = sse.next()
            while item == {"comment": "ping"}:
                item = sse.next()
            assert item is not None and item["id"] == "4"
