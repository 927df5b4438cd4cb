"""An independent client that records its own history of every request, and the checker of that history.

The client speaks plain HTTP (urllib, none of the engine's code): it creates tasks with an Idempotency-Key,
treats a timeout, a dropped connection or a 5xx as an *unknown* outcome and retries with the same key, sometimes
gives up waiting on purpose (a very short timeout: the server may still create the task), repeats a create that
already succeeded, and cancels some tasks at random moments. The checker then judges the server only by what the
client saw plus the final state it reads back:

- one task per key: every acknowledged create of a key names the same task;
- every acknowledged create is present;
- an accepted cancel (202) ends CANCELED, or with cancel_outcome TOO_LATE (the job finished first).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

#: what a request to an API that is being killed raises: its outcome is unknown (IncompleteRead, a reply cut short,
#: is an HTTPException, not an OSError)
_LOST = (OSError, http.client.HTTPException)
#: a create given up on after this long has an unknown outcome (the server may still commit it)
IMPATIENT_TIMEOUT_S = 0.02
TIMEOUT_S = 10.0
MAX_TRIES = 12
#: a create is retried (same key) this long: longer than a killed API takes to come back on a busy machine
CREATE_PATIENCE_S = 90.0


@dataclass
class Op:
    kind: str  # create | cancel
    key: str
    outcome: str  # ok | unknown | rejected
    status: int | None = None
    task_id: str | None = None
    task_status: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def counts(self) -> dict[str, int]:
        return dict(Counter(f"{o.kind}:{o.outcome}" for o in self.ops))

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(o) for o in self.ops]


class Client:
    def __init__(self, api_url: str, api_key: str, seed: int, history: History) -> None:
        self.api_url = api_url
        self.api_key = api_key
        self.history = history
        self.rng = random.Random(f"chaos-client:{seed}")
        self._rng_lock = threading.Lock()
        #: a create retries its key at least until then (monotonic), however long that is past CREATE_PATIENCE_S
        self.patience_until = 0.0

    def _chance(self, p: float) -> bool:
        with self._rng_lock:
            return self.rng.random() < p

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, key: str | None, timeout: float
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api_url + path, data=data, method=method, headers=headers)  # noqa: S310 - loopback
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the run's own loopback API
                return int(r.status), json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                doc = json.loads(exc.read() or b"{}")
            except ValueError:
                doc = {}
            return int(exc.code), doc

    def create(self, i: int, key: str) -> str | None:
        """Create task `i` under `key`, retrying unknown outcomes with the same key; returns its id or None."""
        body = {"prompt": f"chaos scene {i}", "model": "sim-v1", "duration_s": 2}
        task_id = None
        give_up = max(time.monotonic() + CREATE_PATIENCE_S, self.patience_until)
        while time.monotonic() < give_up:
            impatient = self._chance(0.1)
            try:
                status, doc = self._request(
                    "POST", "/v1/generations", body, key, IMPATIENT_TIMEOUT_S if impatient else TIMEOUT_S
                )
            except _LOST:  # timeout, reset, refused, a reply cut short (the API was killed): the outcome is unknown
                self.history.add(Op("create", key, "unknown"))
                time.sleep(0.5 if not impatient else 0.05)
                continue
            if status == 202:
                task_id = str(doc["id"])
                self.history.add(Op("create", key, "ok", status, task_id, doc.get("status")))
                if self._chance(0.05):  # a client that retries although it got its answer
                    continue
                return task_id
            if status >= 500 or status in (409, 429):  # 409: the twin is still in flight; 503 shed; 429 rate
                self.history.add(Op("create", key, "unknown", status))
                time.sleep(0.5)
                continue
            self.history.add(Op("create", key, "rejected", status))
            return task_id
        return task_id

    def cancel(self, key: str, task_id: str) -> None:
        for _ in range(MAX_TRIES):
            try:
                status, doc = self._request("POST", f"/v1/generations/{task_id}/cancel", None, None, TIMEOUT_S)
            except _LOST:
                self.history.add(Op("cancel", key, "unknown", None, task_id))
                time.sleep(0.2)
                continue
            if status == 202:
                self.history.add(Op("cancel", key, "ok", status, task_id, doc.get("status")))
                return
            if status >= 500:
                self.history.add(Op("cancel", key, "unknown", status, task_id))
                time.sleep(0.3)
                continue
            self.history.add(Op("cancel", key, "rejected", status, task_id))
            return

    def get(self, task_id: str) -> dict[str, Any] | None:
        for _ in range(MAX_TRIES):
            try:
                status, doc = self._request("GET", f"/v1/generations/{task_id}", None, None, TIMEOUT_S)
            except _LOST:
                time.sleep(0.5)
                continue
            if status == 200:
                return doc
            if status == 404:
                return None
            time.sleep(0.5)
        raise RuntimeError(f"GET /v1/generations/{task_id} kept failing")

    def run(self, n: int, key_prefix: str, concurrency: int, cancel_p: float, spread_s: float) -> None:
        """Submit n tasks over about `spread_s` seconds; cancel each acknowledged one with probability cancel_p."""
        start = time.monotonic()

        def one(i: int) -> None:
            # spread arrivals so faults land on every stage of the pipeline, not only on intake
            delay = start + spread_s * i / max(n, 1) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = f"{key_prefix}-{i}"
            task_id = self.create(i, key)
            if task_id is not None and self._chance(cancel_p):
                with self._rng_lock:
                    wait = self.rng.uniform(0, 4)
                time.sleep(wait)
                self.cancel(key, task_id)

        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(n)))


def check(history: History, final: dict[str, dict[str, Any] | None], db_keys: dict[str, list[str]]) -> list[str]:
    """The history checker's verdict: a list of violations (empty = the history is explained by the server).

    `final`: task id → the task as GET returns it after quiescence (None = 404); `db_keys`: idempotency key →
    the task ids the database holds for it."""
    violations: list[str] = []
    acked: dict[str, set[str]] = defaultdict(set)
    for op in history.ops:
        if op.kind == "create" and op.outcome == "ok" and op.task_id:
            acked[op.key].add(op.task_id)
    for key, ids in acked.items():
        if len(ids) > 1:
            violations.append(f"key {key}: acknowledged as {len(ids)} different tasks {sorted(ids)}")
        for task_id in ids:
            if final.get(task_id) is None:
                violations.append(f"key {key}: acknowledged task {task_id} is missing")
    for key, ids in db_keys.items():
        if len(ids) > 1:
            violations.append(f"key {key}: {len(ids)} tasks in the database {ids}")
        if key in acked and set(ids) != acked[key]:
            violations.append(f"key {key}: database holds {ids}, the client was told {sorted(acked[key])}")
    for op in history.ops:
        if op.kind != "cancel" or op.outcome != "ok" or op.task_id is None:
            continue
        task = final.get(op.task_id) or {}
        if task.get("status") != "CANCELED" and task.get("cancel_outcome") != "TOO_LATE":
            violations.append(
                f"task {op.task_id}: cancel accepted (202, {op.task_status}) but it ended "
                f"{task.get('status')} cancel_outcome={task.get('cancel_outcome')}"
            )
    return sorted(set(violations))
