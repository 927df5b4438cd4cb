"""The steady stream of creates (`POST /v1/generations` at a fixed rate, each with its own Idempotency-Key) and
the harness's direct reads of the database, every answer recorded with its time."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.tables import alerts, credit_ledger, generation_tasks, outbox_events
from bench.e2e.model import BODY, TERMINAL


@dataclass
class Answer:
    t: float  # wall clock when the request was sent
    status: int | None  # None: no HTTP answer at all (connection error, timeout)
    latency_s: float
    content_type: str = ""
    task_id: str | None = None
    error: str = ""
    #: a problem's `current_status` (a 409 says which state refused the request)
    current_status: str | None = None


def call(method: str, url: str, key: str, body: dict[str, Any] | None = None, timeout_s: float = 10) -> Answer:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if method == "POST" and url.endswith("/v1/generations"):
        headers["Idempotency-Key"] = uuid.uuid4().hex
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - loopback
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - loopback
            raw, status, ctype = r.read(), r.status, r.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("content-type", "")
    except OSError as exc:
        return Answer(t0, None, time.time() - t0, error=f"{type(exc).__name__}: {exc}"[:200])
    ans = Answer(t0, status, time.time() - t0, ctype)
    if status in (200, 202):
        try:
            ans.task_id = str(json.loads(raw)["id"])
        except (ValueError, KeyError, TypeError):
            ans.error = "no id in the answer"
    else:
        ans.error = raw[:200].decode(errors="replace")
        try:
            ans.current_status = json.loads(raw).get("current_status")
        except (ValueError, AttributeError):
            pass
    return ans


@dataclass
class Load:
    """Creates at `rate` per second from a thread until `stop()`; a slow answer delays the next send, never
    doubles it up (the load is steady, not a burst after a stall)."""

    api_url: str
    api_key: str
    rate: float
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="degrade-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        period, nxt = 1.0 / self.rate, time.monotonic()
        while not self._stop.is_set():
            self.answers.append(call("POST", self.api_url + "/v1/generations", self.api_key, BODY))
            nxt = max(nxt + period, time.monotonic())
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def between(self, t0: float, t1: float) -> list[Answer]:
        return [a for a in list(self.answers) if t0 <= a.t < t1]

    def accepted_ids(self) -> set[str]:
        return {a.task_id for a in list(self.answers) if a.status == 202 and a.task_id}


class Db:
    """Read-only queries on the system's database, over a direct connection (never through the proxy)."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2)

    def close(self) -> None:
        self.engine.dispose()

    def statuses(self) -> Counter[str]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(generation_tasks.c.status, sa.func.count()).group_by(generation_tasks.c.status)
            )
            return Counter({str(s): int(n) for s, n in rows})

    def task_status(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            return {
                str(i): str(s) for i, s in conn.execute(sa.select(generation_tasks.c.id, generation_tasks.c.status))
            }

    def all_terminal(self) -> bool:
        counts = self.statuses()
        return sum(n for s, n in counts.items() if s not in TERMINAL) == 0

    def outbox_pending(self, due_only: bool = False) -> int:
        """PENDING outbox rows; `due_only`: only those already due (a row scheduled later is a planned retry or
        delay, not one the relay failed to publish)."""
        q = sa.select(sa.func.count()).where(outbox_events.c.status == "PENDING")
        if due_only:
            q = q.where(outbox_events.c.available_at <= sa.func.now())
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def alert_count(self, rule: str) -> int:
        """Alerts of `rule`, whatever their status (one per subject: the rule's dedup key)."""
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).where(alerts.c.rule == rule)).scalar_one())

    def ledger_violations(self) -> list[str]:
        """Tasks charged other than once: RESERVE ≠ 1, or more than one SETTLE/RELEASE, or a terminal task with
        neither (its reservation never given back or settled)."""
        per: dict[str, Counter[str]] = {}
        with self.engine.connect() as conn:
            for task_id, kind in conn.execute(sa.select(credit_ledger.c.task_id, credit_ledger.c.entry_type)):
                per.setdefault(str(task_id), Counter())[str(kind)] += 1
        bad = []
        for task_id, status in self.task_status().items():
            c = per.get(task_id, Counter())
            closing = c["SETTLE"] + c["RELEASE"]
            if c["RESERVE"] != 1 or closing > 1 or (status in TERMINAL and closing != 1):
                bad.append(f"{task_id} {status}: {dict(c)}")
        return bad
