"""SSE limits (issue 16 item 6): connection caps → 429, slow-consumer eviction, coalescing.

The caps run against the real API on a loopback port; eviction drives the response with an ASGI `send` that never
drains (what a client with a full socket buffer looks like to the server); coalescing pulls the service stream
directly, so the test decides exactly when the stream reads.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aivedio_engine.api.sse import EventStreamResponse
from aivedio_engine.domain.transitions import TaskEvent
from aivedio_engine.services import notifications
from aivedio_engine.services.errors import TooManyStreams
from aivedio_engine.services.stream_slots import StreamSlots
from tests.api.test_events_sse import READ_TIMEOUT_S, SSE, Api, api_with_workers, drive
from tests.contract import wait_until
from tests.support.app import make_context, running_api, tenant_with_key


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Api]:
    limits = {"sse_heartbeat_s": 60, "sse_max_streams": 2, "sse_max_streams_per_tenant": 1, "sse_retry_after_s": 7}
    # no relay or worker: nothing but the test moves a task
    ctx = make_context(tmp_path / "data", api=limits)
    try:
        with running_api(ctx) as base:
            yield Api(ctx, base, tenant_with_key(ctx, "alice", credits=100))
    finally:
        ctx.close()


def _refused(r: httpx.Response, why: str) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.headers["retry-after"] == "7"
    body = r.json()
    assert body["type"].endswith("/too-many-streams")
    assert why in body["detail"]


def test_streams_beyond_the_tenant_cap_and_the_process_cap_get_429_with_retry_after(capped: Api) -> None:
    api = capped
    task_id = api.create()
    bob = tenant_with_key(api.ctx, "bob")
    carol = tenant_with_key(api.ctx, "carol")
    url = f"{api.base}/v1/generations/{task_id}/events"
    with api.stream(task_id) as first:
        held = SSE(first)  # kept: dropping the line iterator would close the connection
        held.events(4)  # admitted and streaming
        # alice's second stream: over her cap of 1, whatever the task
        _refused(httpx.get(url, headers=api.alice.headers, timeout=READ_TIMEOUT_S), "this tenant")
        assert api.ctx.stream_slots.open(api.alice.tenant_id) == 1
        # bob may open one; he gets 404 for alice's task, and a refused open gives its slot back
        r = httpx.get(url, headers=bob.headers, timeout=READ_TIMEOUT_S)
        assert r.status_code == 404
        assert api.ctx.stream_slots.open() == 1
        bob_task = _create(api, bob)
        with api.stream(bob_task, who=bob) as second:
            held_too = SSE(second)
            held_too.events(4)
            # two streams open: the process cap; carol has none and is refused all the same
            r = httpx.get(f"{api.base}/v1/generations/{bob_task}/events", headers=carol.headers, timeout=10)
            _refused(r, "this server")
    # closed by the client: every slot comes back, and alice may stream again
    wait_until(lambda: api.ctx.stream_slots.open() == 0, READ_TIMEOUT_S, "the slots to be released")
    with api.stream(task_id) as again:
        assert len(SSE(again).events(4)) == 4


def test_a_stream_that_ends_on_its_own_releases_its_slot(capped: Api) -> None:
    task_id = capped.create()
    capped.ctx.generations.cancel(capped.alice.tenant_id, uuid.UUID(task_id))
    for _ in range(3):  # a cap of 1: each stream must have given its slot back for the next to open
        with capped.stream(task_id) as r:
            sse = SSE(r)
            assert sse.events(5)[-1]["status"] == "CANCELED"
            assert sse.next() is None
        wait_until(lambda: capped.ctx.stream_slots.open() == 0, READ_TIMEOUT_S, "the slot to be released")


def _create(api: Api, who: Any) -> str:
    r = httpx.post(
        api.base + "/v1/generations",
        json={"prompt": "a red fox running through snow", "model": "local-v1"},
        headers={**who.headers, "Idempotency-Key": "b1"},
        timeout=READ_TIMEOUT_S,
    )
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def test_slot_accounting_is_per_tenant_and_release_is_idempotent() -> None:
    slots = StreamSlots(max_streams=3, max_per_tenant=2, retry_after_s=1)
    a, b = uuid.uuid4(), uuid.uuid4()
    a1, a2 = slots.acquire(a), slots.acquire(a)
    with pytest.raises(TooManyStreams) as refused:
        slots.acquire(a)
    assert refused.value.extra["retry_after_s"] == 1
    b1 = slots.acquire(b)
    with pytest.raises(TooManyStreams):
        slots.acquire(b)  # b is under its own cap, but the process is full
    a1.release()
    a1.release()  # twice: still one slot back, not two
    assert (slots.open(), slots.open(a), slots.open(b)) == (2, 1, 1)
    slots.acquire(b)
    for s in (a2, b1):
        s.release()
    assert slots.open() == 1


# ------------------------------------------------------------------------------------------- eviction


def test_a_client_that_stops_reading_is_evicted_and_its_slot_and_stream_are_freed() -> None:
    slots = StreamSlots(10, 10, 1)
    slot = slots.acquire(uuid.uuid4())
    closed = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def frames() -> AsyncIterator[str]:
        try:
            n = 0
            while True:  # an endless stream: only eviction can end it
                n += 1
                yield f": ping {n}\n\n"
        finally:
            closed.set()

    async def scenario() -> None:
        stalled = asyncio.Event()  # never set: the socket's buffer is full and the client reads nothing

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and len(sent) > 3:
                await stalled.wait()

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client never disconnects either
            return {}

        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        response = EventStreamResponse(frames(), slot, slots, send_timeout_s=0.05)
        await asyncio.wait_for(response(scope, receive, send), READ_TIMEOUT_S)

    asyncio.run(scenario())
    assert closed.is_set(), "the stream's generator (its subscription and reads) is closed"
    assert slots.open() == 0 and slots.evicted == 1
    # the start, two frames that drained, and the one that did not; no final chunk was attempted
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 3
    assert all(m.get("more_body", True) for m in sent[1:])


# ----------------------------------------------------------------------------------------- coalescing


def test_coalesce_keeps_the_newest_events() -> None:
    events = [{"version": v} for v in range(10)]
    assert notifications.coalesce(events, 3) == events[-3:]
    assert notifications.coalesce(events, 50) == events


def test_a_burst_between_two_reads_reaches_the_client_as_one_bounded_batch_of_the_latest(tmp_path: Path) -> None:
    with api_with_workers(tmp_path, workers=False) as api:
        task_id = uuid.UUID(api.create())
        ctx = api.ctx

        async def scenario() -> list[list[dict[str, Any]] | None]:
            stream = await notifications.open_stream(
                ctx.engine, ctx.notifier, api.alice.tenant_id, task_id, None, 60, max_batch=2
            )
            batches = [await anext(stream)]  # the history, coalesced: 4 events, the newest 2 sent
            # a burst while the client has not asked for more (a slow reader): four transitions, four signals
            for event in (TaskEvent.RETRYABLE_FAILURE, TaskEvent.RETRY_DUE) * 2:
                await asyncio.to_thread(drive, ctx, str(task_id), event)
                ctx.notifier.publish(task_id, 0)  # what the notify worker does after each commit
            batches.append(await anext(stream))  # one read for the whole burst
            await stream.aclose()  # type: ignore[attr-defined]
            return batches

        history, burst = asyncio.run(scenario())
    assert history is not None and [(e["status"], e["version"]) for e in history] == [
        ("QUOTA_RESERVED", 2),
        ("QUEUED", 3),
    ]
    assert burst is not None and [(e["status"], e["version"]) for e in burst] == [("RETRY_WAIT", 6), ("QUEUED", 7)]


def test_one_signal_to_many_streams_of_a_task_costs_one_read_and_a_later_signal_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with api_with_workers(tmp_path, workers=False) as api:
        ctx, tenant = api.ctx, api.alice.tenant_id
        task_id = uuid.UUID(api.create())
        real_read = notifications._read
        reads: list[int | None] = []
        first_may_end = threading.Event()

        def counted(engine: Any, tenant_id: Any, tid: Any, after: Any) -> Any:
            reads.append(after)
            if len(reads) == 1:
                first_may_end.wait(READ_TIMEOUT_S)  # in flight while the test signals again
            return real_read(engine, tenant_id, tid, after)

        monkeypatch.setattr(notifications, "_read", counted)

        async def scenario() -> tuple[list[Any], Any]:
            subs = [ctx.notifier.subscribe(task_id) for _ in range(5)]
            await asyncio.to_thread(drive, ctx, str(task_id), TaskEvent.RETRYABLE_FAILURE)
            ctx.notifier.publish(task_id, 4)
            assert all([await s.wait(READ_TIMEOUT_S) for s in subs])
            # the five streams woken by that signal: one read, started by the first, joined by the others
            shared = [asyncio.ensure_future(notifications._shared_read(ctx.engine, tenant, s)) for s in subs]
            await asyncio.sleep(0)  # every one has joined (the read's thread has not even started)
            assert len(notifications._inflight) == 1
            # a change after the read started: a stream woken by its signal must not take the older read
            await asyncio.to_thread(drive, ctx, str(task_id), TaskEvent.RETRY_DUE)
            ctx.notifier.publish(task_id, 5)
            assert await subs[0].wait(READ_TIMEOUT_S)
            fresh = asyncio.ensure_future(notifications._shared_read(ctx.engine, tenant, subs[0]))
            await asyncio.sleep(0)
            first_may_end.set()
            results = await asyncio.gather(*shared)
            later = await fresh
            for s in subs:
                s.close()
            return results, later

        results, later = asyncio.run(scenario())
    assert reads == [None, None], "one read for the five streams, one for the stream woken by the later signal"
    assert all(r is results[0] for r in results) and results[0].events[-1]["version"] >= 4
    assert later.events[-1]["version"] == 5
    assert not notifications._inflight
