"""A user's generation jobs on top of a `GenerationClient`: submit one (resumable), follow it, run a batch.

Resuming rests on the Idempotency-Key: before uploading anything, the client asks whether the key already
made a task; a re-run of the same batch line therefore never uploads again nor creates a second task.

Following stops early when `stop` is set (Ctrl-C): the tasks are left as they are, to be followed again later.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aivedio_engine.client import ClientError, GenerationClient, Snapshot

#: request fields a batch line may carry besides prompt/images/videos/key
REQUEST_FIELDS = (
    "model",
    "provider",
    "duration_s",
    "resolution",
    "aspect_ratio",
    "seed",
    "priority",
    "deadline_s",
    "n",
)


class Stop(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopFlag:
    """A stop request a signal handler may make: `set()` only stores a bool.

    (`threading.Event.set` takes a lock; a handler that runs while its own thread holds that lock, e.g. inside
    `Event.wait`, would deadlock.) `wait` polls the bool every `poll_s`."""

    def __init__(self, poll_s: float = 0.05) -> None:
        self._set = False
        self._poll_s = poll_s

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            left = self._poll_s if deadline is None else min(self._poll_s, deadline - time.monotonic())
            if left <= 0:
                break
            time.sleep(left)
        return self._set


@dataclass(frozen=True)
class JobSpec:
    prompt: str
    images: tuple[Path, ...] = ()
    videos: tuple[Path, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str = ""
    line: int = 0


def submit(client: GenerationClient, spec: JobSpec) -> tuple[Snapshot, bool]:
    """(task, resumed): the task already made with this key, or a new one after uploading the references."""
    existing = client.find(spec.idempotency_key)
    if existing is not None:
        return existing, True
    asset_ids = [client.upload(p) for p in (*spec.images, *spec.videos)]
    body: dict[str, Any] = {"prompt": spec.prompt, **spec.options}
    body.setdefault("model", client.default_model())
    if asset_ids:
        body["asset_ids"] = asset_ids
    return client.create(body, spec.idempotency_key), False


def follow(
    client: GenerationClient,
    snap: Snapshot,
    on_change: Callable[[Snapshot], None],
    *,
    timeout_s: float,
    interval_s: float = 0.25,
    stop: Stop | None = None,
) -> Snapshot:
    """Report every change of status or progress until the task ends, `timeout_s` passes or `stop` is set.

    Polls `get` — the source of truth — at `interval_s`. A client that can read the stored history
    (`changes`, embedded) reports every transition, also those that came and went between two polls; otherwise
    a change missed between two reads is still visible as the next status. The final snapshot is always re-read."""
    stop = stop if stop is not None else threading.Event()
    deadline = time.monotonic() + timeout_s
    history = getattr(client, "changes", None)
    last, seen_version = (snap.status, snap.progress), snap.version
    on_change(snap)
    while not snap.finished and time.monotonic() < deadline and not stop.is_set():
        stop.wait(interval_s)
        if history is not None:
            for change in history(snap.id, seen_version):
                seen_version = change.version
                if change.status != last[0]:
                    last = (change.status, change.progress)
                    on_change(change)
        snap = client.get(snap.id)
        if (snap.status, snap.progress) != last:
            last = (snap.status, snap.progress)
            on_change(snap)
    return snap


def parse_batch(path: Path) -> list[JobSpec]:
    """One JSON object per line: {"prompt", "images"?, "videos"?, "key"?, and request fields}. Blank lines and
    lines starting with '#' are skipped. Relative file paths are relative to the batch file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClientError(f"{path}: {exc.strerror or exc}") from None
    specs: list[JobSpec] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ClientError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except ValueError as exc:  # e.g. an integer longer than Python's int-conversion digit limit
            raise ClientError(f"{path}:{number}: not JSON ({exc})") from None
        specs.append(_spec(doc, path, number, line))
    if not specs:
        raise ClientError(f"{path}: no generations in the file")
    return specs


def _spec(doc: Any, path: Path, number: int, line: str) -> JobSpec:
    where = f"{path}:{number}"
    if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str) or not doc["prompt"].strip():
        raise ClientError(f'{where}: each line needs a non-empty "prompt"')
    unknown = set(doc) - {"prompt", "images", "videos", "key", *REQUEST_FIELDS}
    if unknown:
        raise ClientError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    files = {}
    for name in ("images", "videos"):
        value = doc.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ClientError(f'{where}: "{name}" must be a list of file paths')
        files[name] = tuple((path.parent / v) if not Path(v).is_absolute() else Path(v) for v in value)
    key = doc.get("key")
    if key is not None and (not isinstance(key, str) or not key.strip()):
        raise ClientError(f'{where}: "key" must be a non-empty string')
    # the default key is the line's content and position: editing a line makes it a new request
    default = "batch:" + hashlib.sha256(f"{path.name}:{number}:{line}".encode()).hexdigest()[:40]
    return JobSpec(
        doc["prompt"],
        files["images"],
        files["videos"],
        {k: doc[k] for k in REQUEST_FIELDS if k in doc},
        key or default,
        number,
    )


@dataclass(frozen=True)
class BatchResult:
    spec: JobSpec
    snapshot: Snapshot | None
    resumed: bool = False
    error: str | None = None
    #: following stopped (Ctrl-C) before the task ended; `snapshot` is None when it was never submitted
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return self.snapshot is not None and self.snapshot.status == "SUCCEEDED"

    def as_dict(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "line": self.spec.line,
            "key": self.spec.idempotency_key,
            "id": snap and snap.id,
            "status": snap.status if snap else "NOT_SUBMITTED",
            "resumed": self.resumed,
            "outputs": snap.outputs if snap else {},
            "error": self.error or (snap and snap.error),
        }


def run_batch(
    client: GenerationClient,
    specs: Iterable[JobSpec],
    *,
    concurrency: int,
    timeout_s: float,
    on_result: Callable[[BatchResult], None],
    stop: Stop | None = None,
    interval_s: float = 0.5,
) -> list[BatchResult]:
    """Submit and follow every job with `concurrency` at a time; `on_result` is called as each one ends.

    Once `stop` is set nothing more is submitted and following ends: those results are `interrupted` (and not
    passed to `on_result`, since their tasks did not end)."""

    def one(spec: JobSpec) -> BatchResult:
        if stop is not None and stop.is_set():
            return BatchResult(spec, None, error="interrupted before it was submitted", interrupted=True)
        try:
            snap, resumed = submit(client, spec)
            snap = follow(client, snap, lambda _: None, timeout_s=timeout_s, interval_s=interval_s, stop=stop)
            if not snap.finished and stop is not None and stop.is_set():
                return BatchResult(spec, snap, resumed, "interrupted", interrupted=True)
            result = BatchResult(
                spec, snap, resumed, None if snap.finished else f"not finished after {timeout_s:g}s ({snap.status})"
            )
        except ClientError as exc:
            result = BatchResult(spec, None, error=str(exc))
        on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="aivedio-batch") as pool:
        return list(pool.map(one, specs))
