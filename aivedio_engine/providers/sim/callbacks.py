"""Callback delivery for the simulator: one background thread, Standard Webhooks signatures, seeded chaos.

Events are delivered in emission order from a single thread, so the drop/duplicate/reorder dice are rolled in
a reproducible order for a given seed. Duplicates reuse the `webhook-id` (that is what a vendor's retry looks
like); every attempt gets a fresh timestamp and signature. The timestamp is wall-clock time, not the sim clock:
receivers check it against their own clock.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aivedio_engine.httpclient import HttpClient, Timeouts, TransportError
from aivedio_engine.providers.webhooks import sign_webhook

if TYPE_CHECKING:
    from aivedio_engine.providers.sim.server import Job, SimState

ATTEMPTS = 3
REORDER_HOLD_S = 0.2  # a held-back event is flushed after this much idle time


@dataclass(eq=False)
class _Event:
    url: str
    event_id: str
    job_id: str
    status: str
    body: bytes
    generation: int
    urgent: bool = False
    copies: int = 1
    done: threading.Event = field(default_factory=threading.Event)


class CallbackDispatcher:
    def __init__(self, state: SimState) -> None:
        self._state = state
        self._queue: queue.Queue[_Event | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._stats = {
            "emitted": 0,
            "delivered": 0,
            "duplicates": 0,
            "dropped": 0,
            "reordered": 0,
            "early": 0,
            "failed": 0,
            "pending": 0,
        }
        self.log: list[dict[str, Any]] = []  # one row per HTTP attempt, for tests and debugging

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sim-callbacks", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def forget_pending(self) -> None:
        with self._lock:
            self._generation += 1
            self._stats = dict.fromkeys(self._stats, 0)
            self.log = []

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def emit(self, job: Job, body: dict[str, Any], urgent: bool = False) -> threading.Event | None:
        """Queue the job's current state; returns an event set once delivery ended (None: no callback URL)."""
        url = job.callback_url or self._state.config.webhook_url
        if not url:
            return None
        job.events += 1
        event_id = f"evt_{job.id}_{job.events}"
        raw = json.dumps({**body, "event_id": event_id}, separators=(",", ":")).encode()
        with self._lock:
            self._stats["emitted"] += 1
            self._stats["pending"] += 1
            self._stats["early"] += int(urgent)
            ev = _Event(url, event_id, job.id, body["status"], raw, self._generation, urgent)
        self._queue.put(ev)
        return ev.done

    def _run(self) -> None:
        http = HttpClient(timeouts=Timeouts(connect=2.0, read=5.0, write=5.0, pool=2.0))
        held: _Event | None = None
        try:
            while True:
                try:
                    ev = self._queue.get(timeout=REORDER_HOLD_S if held else 0.5)
                except queue.Empty:
                    if held is not None:
                        self._deliver(http, held)
                        held = None
                    continue
                if ev is None:
                    break
                if ev.generation != self._generation:
                    self._done(ev)
                    continue
                if ev.urgent:
                    self._deliver(http, ev)
                    continue
                faults, dice = self._state.faults, self._state.dice
                drop = dice.roll("drop_cb", faults.p("drop_cb"))
                dup = dice.roll("dup_cb", faults.p("dup_cb"))
                reorder = dice.roll("reorder_cb", faults.p("reorder_cb"))
                if drop:
                    self._count("dropped", ev.generation)
                    self._done(ev)
                    continue
                if dup:
                    ev.copies += dice.randint("dup_cb_copies", 1, 3)
                if held is None and reorder:
                    self._count("reordered", ev.generation)
                    held = ev
                    continue
                self._deliver(http, ev)
                if held is not None:
                    self._deliver(http, held)
                    held = None
            if held is not None:
                self._deliver(http, held)
        finally:
            http.close()

    def _deliver(self, http: HttpClient, ev: _Event) -> None:
        try:
            for copy in range(ev.copies):
                if copy:
                    self._count("duplicates", ev.generation)
                self._send(http, ev)
        finally:
            self._done(ev)

    def _send(self, http: HttpClient, ev: _Event) -> None:
        secrets = self._state.config.webhook_secrets
        for attempt in range(1, ATTEMPTS + 1):
            if ev.generation != self._generation:
                return  # reset meanwhile: nobody waits for this delivery any more
            ts = int(time.time())
            if secrets:
                headers = sign_webhook(secrets, ev.event_id, ts, ev.body)
            else:
                headers = {"webhook-id": ev.event_id, "webhook-timestamp": str(ts)}
            headers["content-type"] = "application/json"
            try:
                result: int | str = http.request("POST", ev.url, content=ev.body, headers=headers).status
            except TransportError as exc:
                result = type(exc).__name__
            with self._lock:
                self.log.append(
                    {
                        "event_id": ev.event_id,
                        "job_id": ev.job_id,
                        "status": ev.status,
                        "attempt": attempt,
                        "result": result,
                    }
                )
            if isinstance(result, int) and 200 <= result < 300:
                self._count("delivered", ev.generation)
                return
            if attempt < ATTEMPTS:
                time.sleep(0.05 * 4 ** (attempt - 1))  # a sender's retry backoff, compressed
        self._count("failed", ev.generation)

    def _done(self, ev: _Event) -> None:
        """`pending` reaches 0 only when every emitted event was delivered, dropped or given up on."""
        self._count("pending", ev.generation, -1)
        ev.done.set()

    def _count(self, key: str, generation: int | None = None, by: int = 1) -> None:
        with self._lock:
            # a delivery still in flight across a reset must not leak into the next run's numbers
            if generation is None or generation == self._generation:
                self._stats[key] += by
