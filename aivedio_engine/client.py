"""Submitting generations as a user does: upload references, create, follow, collect outputs.

Two implementations of one small interface, so `aivedio generate` and `aivedio batch` do not care where the
engine runs: `EmbeddedClient` calls the services in this process (through the same upload path the API uses:
upload session → signed PUT handler → complete); `RemoteClient` talks to a running server's HTTP API.
"""

from __future__ import annotations

import hashlib
import mimetypes
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urljoin, urlsplit

from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.media.sniff import HEAD_BYTES, sniff
from aivedio_engine.storage.base import CHUNK, iter_file

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.tenants import Principal

TERMINAL = frozenset(s.value for s in TASK_TERMINAL)


class ClientError(Exception):
    """A request the engine refused (bad input, rejected reference, unreachable server): one line for the user."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    id: str
    status: str
    version: int
    progress: int
    error: str | None = None
    #: profile → local path (embedded) or signed URL (remote); filled once the task SUCCEEDED
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class GenerationClient(Protocol):
    def default_model(self) -> str: ...

    def find(self, idempotency_key: str) -> Snapshot | None: ...

    def upload(self, path: Path) -> str: ...

    def create(self, body: dict[str, Any], idempotency_key: str) -> Snapshot: ...

    def get(self, task_id: str) -> Snapshot: ...

    def close(self) -> None: ...


def content_type_of(path: Path) -> str:
    """What the bytes are (magic number), falling back to the file name; the server checks again anyway."""
    with open(path, "rb") as f:
        found = sniff(f.read(HEAD_BYTES))
    return found.mime or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter_file(f):
            digest.update(chunk)
    return digest.hexdigest()


def _readable(path: Path) -> Path:
    if not path.is_file():
        raise ClientError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise ClientError(f"{path}: the file is empty")
    return path


@contextmanager
def _refusals() -> Iterator[None]:
    """Service refusals (bad input, no credits, not found) as the one-line ClientError the CLI shows."""
    from aivedio_engine.services.errors import ServiceError

    try:
        yield
    except ServiceError as exc:
        raise ClientError(str(exc)) from None


class EmbeddedClient:
    def __init__(self, ctx: AppContext, principal: Principal) -> None:
        self._ctx = ctx
        self._principal = principal

    def default_model(self) -> str:
        catalog = self._ctx.catalog
        preferred = [m for m in catalog.models if m.provider == catalog.default_provider] or list(catalog.models)
        if not preferred:
            raise ClientError("no models are configured (see [providers] in aivedio.toml)")
        return preferred[0].model

    def find(self, idempotency_key: str) -> Snapshot | None:
        with _refusals():
            task = self._ctx.generations.find_by_key(self._principal.tenant_id, idempotency_key)
        return None if task is None else self._snapshot(task)

    def upload(self, path: Path) -> str:
        with _refusals():
            return self._upload(_readable(path))

    def _upload(self, path: Path) -> str:
        assets = self._ctx.assets
        view, target = assets.create_upload(self._principal, path.name, path.stat().st_size, content_type_of(path),
                                            sha256_file(path))
        query = parse_qs(urlsplit(target.url).query)
        upload_id = urlsplit(target.url).path.rstrip("/").rsplit("/", 1)[-1]
        with open(path, "rb") as f:
            assets.receive_upload(upload_id, int(query["expires"][0]), query["sig"][0], iter_file(f),
                                  content_length=path.stat().st_size)
        done = assets.complete(self._principal, view.id)
        if done.status != "READY":
            raise ClientError(f"{path.name} was rejected: {done.error or done.status}")
        return str(done.id)

    def create(self, body: dict[str, Any], idempotency_key: str) -> Snapshot:
        with _refusals():
            created = self._ctx.generations.create(self._principal.tenant_id, idempotency_key, body)
        return self._snapshot(created.task)

    def get(self, task_id: str) -> Snapshot:
        return self._snapshot(self._ctx.generations.get(self._principal.tenant_id, uuid.UUID(task_id)))

    def changes(self, task_id: str, after_version: int) -> list[Snapshot]:
        """Every state change after `after_version`, from the stored history (none is missed between polls)."""
        from aivedio_engine.services import notifications

        events = notifications.history(self._ctx.engine, self._principal.tenant_id, uuid.UUID(task_id),
                                       after_version)
        return [Snapshot(task_id, e["status"], int(e["version"]), int(e["progress"] or 0)) for e in events]

    def _snapshot(self, task: Any) -> Snapshot:
        outputs: dict[str, str] = {}
        if task.status == TaskStatus.SUCCEEDED.value:
            outputs = {p: str(path) for p, path in
                       self._ctx.outputs.local_paths(self._principal.tenant_id, task.id).items()}
        return Snapshot(str(task.id), task.status, task.version, task.progress,
                        task.last_error_class and f"{task.last_error_class}", outputs)

    def close(self) -> None:
        pass


class RemoteClient:
    def __init__(self, api_url: str, api_key: str, *, timeout_s: float = 30.0) -> None:
        from aivedio_engine.httpclient import HttpClient, Timeouts

        self._base = api_url.rstrip("/") + "/"
        self._http = HttpClient(self._base, Timeouts(read=timeout_s, write=timeout_s),
                                headers={"Authorization": f"Bearer {api_key}"})
        # upload targets carry their own credential: our API key must not travel to object storage
        self._bare = HttpClient(timeouts=Timeouts(read=timeout_s, write=timeout_s))

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        from aivedio_engine.httpclient import TransportError

        try:
            response = self._http.request(method, path, **kwargs)
        except TransportError as exc:
            raise ClientError(f"cannot reach {self._base}: {exc}") from None
        if response.status >= 400:
            raise ClientError(_problem_line(response.status, response.body))
        return response.json()

    def default_model(self) -> str:
        models = self._call("GET", "v1/models")["data"]
        if not models:
            raise ClientError("the server offers no models")
        return str(models[0]["model"])

    def find(self, idempotency_key: str) -> Snapshot | None:
        page = self._call("GET", "v1/generations", params={"idempotency_key": idempotency_key})["data"]
        return self._snapshot(page[0]) if page else None

    def upload(self, path: Path) -> str:
        path = _readable(path)
        size = path.stat().st_size
        created = self._call("POST", "v1/assets", json={
            "filename": path.name, "size_bytes": size, "content_type": content_type_of(path),
            "sha256": sha256_file(path)})
        target = created["upload"]
        url = urljoin(self._base, target["url"])
        with open(path, "rb") as f:
            if target["method"] == "PUT":
                self._send("PUT", url, content=_chunks(f), headers={**target["headers"],
                                                                    "Content-Length": str(size)})
            else:  # presigned POST: the policy fields first, then the file
                self._send("POST", url, data=target["fields"], files={"file": (path.name, f)})
        done = self._call("POST", f"v1/assets/{created['id']}/complete")
        if done["status"] != "READY":
            raise ClientError(f"{path.name} was rejected: {done.get('error') or done['status']}")
        return str(done["id"])

    def _send(self, method: str, url: str, **kwargs: Any) -> None:
        from aivedio_engine.httpclient import TransportError

        try:
            response = self._bare.request(method, url, **kwargs)
        except TransportError as exc:
            raise ClientError(f"upload failed: {exc}") from None
        if response.status >= 300:
            raise ClientError(f"upload failed: HTTP {response.status}")

    def create(self, body: dict[str, Any], idempotency_key: str) -> Snapshot:
        return self._snapshot(self._call("POST", "v1/generations", json=body,
                                         headers={"Idempotency-Key": idempotency_key}))

    def get(self, task_id: str) -> Snapshot:
        return self._snapshot(self._call("GET", f"v1/generations/{task_id}"))

    def _snapshot(self, doc: dict[str, Any]) -> Snapshot:
        outputs = {p: urljoin(self._base, u) for p, u in (doc.get("outputs") or {}).items()}
        return Snapshot(str(doc["id"]), doc["status"], int(doc["version"]), int(doc["progress"]),
                        doc.get("error_class"), outputs)

    def close(self) -> None:
        self._http.close()
        self._bare.close()


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


def _problem_line(status: int, body: bytes) -> str:
    import json

    try:
        doc = json.loads(body)
    except ValueError:
        return f"HTTP {status}"
    if isinstance(doc, dict):
        detail = doc.get("detail") or doc.get("title")
        if isinstance(detail, str):
            return f"HTTP {status}: {detail}"
    return f"HTTP {status}"
