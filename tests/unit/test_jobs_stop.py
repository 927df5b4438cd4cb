"""Ctrl-C in `aivedio generate` / `batch run`: `jobs.StopFlag` (settable from a signal handler), `follow` returning
at once, `run_batch` submitting nothing more and reporting its unfinished jobs as interrupted."""

from __future__ import annotations

import threading
import time
from typing import Any

from aivedio_engine.client import Snapshot
from aivedio_engine.jobs import BatchResult, JobSpec, StopFlag, follow, run_batch


class _NeverFinishes:
    def __init__(self, stop_after_creates: int | None = None, stop: StopFlag | None = None) -> None:
        self.created: list[str] = []
        self._stop_after, self._stop = stop_after_creates, stop
        self._lock = threading.Lock()

    def default_model(self) -> str:
        return "m"

    def find(self, key: str) -> Snapshot | None:
        return None

    def upload(self, path: Any) -> str:
        raise AssertionError("no references in these specs")

    def close(self) -> None:
        pass

    def create(self, body: dict[str, Any], key: str) -> Snapshot:
        with self._lock:
            self.created.append(key)
            if self._stop is not None and len(self.created) == self._stop_after:
                self._stop.set()  # Ctrl-C lands right after this submit
        return Snapshot(f"id-{key}", "QUEUED", 1, 0)

    def get(self, task_id: str) -> Snapshot:
        return Snapshot(task_id, "RUNNING", 2, 10)


def test_the_flag_wakes_a_waiter_and_times_out_otherwise() -> None:
    flag = StopFlag(poll_s=0.01)
    started = time.monotonic()
    assert flag.wait(0.05) is False and time.monotonic() - started >= 0.05
    threading.Timer(0.05, flag.set).start()
    started = time.monotonic()
    assert flag.wait(30) is True and time.monotonic() - started < 5
    assert flag.is_set() and flag.wait(0) is True


def test_follow_returns_the_unfinished_task_once_stopped() -> None:
    flag = StopFlag(poll_s=0.01)
    threading.Timer(0.1, flag.set).start()
    started = time.monotonic()
    snap = follow(
        _NeverFinishes(), Snapshot("t", "QUEUED", 1, 0), lambda s: None, timeout_s=60, interval_s=0.05, stop=flag
    )
    assert snap.status == "RUNNING" and not snap.finished and time.monotonic() - started < 5


def test_a_stopped_batch_submits_nothing_more_and_reports_the_rest_as_interrupted() -> None:
    flag = StopFlag(poll_s=0.01)
    client = _NeverFinishes(stop_after_creates=2, stop=flag)
    specs = [JobSpec(f"p{i}", idempotency_key=f"k{i}", line=i) for i in range(6)]
    ended: list[BatchResult] = []
    results = run_batch(client, specs, concurrency=2, timeout_s=60, on_result=ended.append, stop=flag, interval_s=0.05)
    assert len(client.created) == 2  # the two in flight when Ctrl-C came; nothing after it
    assert [r.interrupted for r in results] == [True] * 6
    assert [r.snapshot is not None for r in results] == [True, True, False, False, False, False]
    assert ended == []  # none of them ended: nothing goes to --out
    assert not any(r.ok for r in results)
