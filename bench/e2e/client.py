"""The benchmark's client: POST a task, follow it to its terminal state over SSE (or by polling GET), then one GET
for the gate. Open loop (tasks sent on a schedule) and closed loop (a fixed number of tasks in flight)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from bench.e2e.model import BODY, TERMINAL
from bench.e2e.stats import SseParser, ts


@dataclass
class TaskRun:
    index: int
    scheduled: float
    key: str
    t_send: float = math.nan
    t_202: float = math.nan
    status_code: int | None = None
    task_id: str | None = None
    t_terminal: float = math.nan
    terminal: str | None = None
    #: status → (server timestamp of the state event, client receive time)
    events: dict[str, tuple[float, float]] = field(default_factory=dict)
    get_status: str | None = None
    outputs: list[str] = field(default_factory=list)
    get_polls: int = 0
    error: str | None = None
    #: not sent: the point stopped sending when its backlog reached --max-backlog
    unsent: bool = False


async def one(
    client: Any, headers: dict[str, str], run: TaskRun, observe: str, interval_s: float, timeout_s: float
) -> None:
    try:
        run.t_send = time.time()
        r = await client.post("/v1/generations", json=BODY, headers={**headers, "Idempotency-Key": run.key})
        run.t_202 = time.time()
        run.status_code = r.status_code
        if r.status_code != 202:
            run.error = f"POST answered {r.status_code}: {r.text[:200]}"
            return
        run.task_id = r.json()["id"]
        if observe == "sse":
            await _follow_sse(client, headers, run, timeout_s)
        else:
            await _poll_get(client, headers, run, interval_s, timeout_s)
        g = await client.get(f"/v1/generations/{run.task_id}", headers=headers)
        doc = g.json()
        run.get_status = doc.get("status")
        run.outputs = sorted((doc.get("outputs") or {}).keys())
    except Exception as exc:  # noqa: BLE001 - recorded, the gate fails on it
        run.error = f"{type(exc).__name__}: {exc}"[:300]


async def _follow_sse(client: Any, headers: dict[str, str], run: TaskRun, timeout_s: float) -> None:
    parser = SseParser()
    async with client.stream(
        "GET", f"/v1/generations/{run.task_id}/events", headers=headers, timeout=timeout_s
    ) as resp:
        if resp.status_code != 200:
            run.error = f"SSE answered {resp.status_code}"
            return
        async for line in resp.aiter_lines():
            ev = parser.feed(line)
            if ev is None:
                continue
            now = time.time()
            run.events.setdefault(ev["status"], (ts(ev.get("at")), now))
            if ev["status"] in TERMINAL:
                run.t_terminal, run.terminal = now, ev["status"]
                return
    run.error = run.error or "the event stream ended without a terminal status"


async def _poll_get(client: Any, headers: dict[str, str], run: TaskRun, interval_s: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        g = await client.get(f"/v1/generations/{run.task_id}", headers=headers)
        now = time.time()
        run.get_polls += 1
        status = g.json().get("status")
        if status in TERMINAL:
            run.t_terminal, run.terminal = now, status
            return
        await asyncio.sleep(interval_s)
    run.error = "no terminal status before the deadline"


async def drive_open(
    api_url: str, api_key: str, runs: list[TaskRun], observe: str, interval_s: float, timeout_s: float, max_backlog: int
) -> dict[str, Any]:
    """Send on schedule (open loop) until done, or until `max_backlog` tasks are in flight (then the rest is not
    sent: the point has shown it cannot keep up, and only makes the drain longer); wait for all to finish."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    info: dict[str, Any] = {"stopped_at_backlog": None}
    in_flight = 0

    def finished(_: Any) -> None:
        nonlocal in_flight
        in_flight -= 1

    async with httpx.AsyncClient(base_url=api_url, limits=limits, timeout=httpx.Timeout(60.0)) as client:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.05
        pending = []
        for run in runs:
            delay = start + run.scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if max_backlog and in_flight >= max_backlog:
                info["stopped_at_backlog"] = {"sent": run.index, "after_s": round(run.scheduled, 2)}
                for rest in runs[run.index :]:
                    rest.unsent = True
                break
            in_flight += 1
            task = asyncio.create_task(one(client, headers, run, observe, interval_s, timeout_s))
            task.add_done_callback(finished)
            pending.append(task)
        info["send_finished"] = time.time()
        done, not_done = await asyncio.wait(pending, timeout=timeout_s)
        for t in not_done:
            t.cancel()
        for run in runs:
            if not run.unsent and math.isnan(run.t_terminal) and run.error is None:
                run.error = "timed out"
    return info


async def drive_closed(
    api_url: str,
    api_key: str,
    runs: list[TaskRun],
    observe: str,
    interval_s: float,
    timeout_s: float,
    concurrency: int,
    gap_s: float = 0.0,
    stop_after_s: float | None = None,
) -> dict[str, Any]:
    """Keep `concurrency` tasks in flight: each finished task is followed by the next one (after `gap_s`), so
    with 1 the tasks run one at a time and with many the system is kept saturated. `scheduled` becomes the
    actual send offset. With `stop_after_s`, no task is sent after that many seconds (the rest stay unsent)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    queue = list(reversed(runs))
    t0 = time.time()

    async def lane() -> None:
        while queue and (stop_after_s is None or time.time() - t0 < stop_after_s):
            run = queue.pop()
            run.scheduled = time.time() - t0
            await one(client, headers, run, observe, interval_s, timeout_s)
            if gap_s:
                await asyncio.sleep(gap_s)

    async with httpx.AsyncClient(base_url=api_url, limits=limits, timeout=httpx.Timeout(60.0)) as client:
        lanes = [asyncio.create_task(lane()) for _ in range(max(1, concurrency))]
        _, not_done = await asyncio.wait(lanes, timeout=timeout_s)
        for t in not_done:
            t.cancel()
    for run in runs:
        if math.isnan(run.t_send):
            run.unsent = True
        elif math.isnan(run.t_terminal) and run.error is None:
            run.error = "timed out"
    return {"stopped_at_backlog": None, "send_finished": time.time(), "concurrency": concurrency}
