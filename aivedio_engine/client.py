"""Submitting generations as a user does: upload references, create, follow, collect outputs.

Two implementations of one small interface, so `aivedio generate` and `aivedio batch` do not care where the
engine runs: `EmbeddedClient` calls the services in this process (through the same upload path the API uses:
upload session → signed PUT handler → complete); `RemoteClient` talks to a running server's HTTP API.
`TaskClient` adds what `aivedio generations` and `aivedio models` need: list, cancel, the model catalog, and
the stored files of a finished task with the checksums their asset rows recorded.
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
from urllib.parse import quote, unquote, urljoin, urlsplit

from aivedio_engine.domain.project_cost import default_model
from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.media.sniff import HEAD_BYTES, sniff
from aivedio_engine.storage.base import CHUNK, iter_file

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.outputs import OutputFile
    from aivedio_engine.services.task_view import TaskView
    from aivedio_engine.services.tenants import Principal

TERMINAL = frozenset(s.value for s in TASK_TERMINAL)


class ClientError(Exception):
    """A request the engine refused (bad input, rejected reference, unreachable server): one line for the user."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        #: why, when the engine said: the problem slug (`not-found`, `invalid-request`, `illegal-state`, ...)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Snapshot:
    id: str
    status: str
    version: int
    progress: int
    error: str | None = None
    #: profile → local path (embedded) or signed URL (remote); filled once the task SUCCEEDED
    outputs: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    provider: str | None = None
    cancel_outcome: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    #: every output of a request for `n`, by index: [{"index": i, "outputs": {profile: path or URL}}]
    variants: list[dict[str, Any]] = field(default_factory=list)

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


@dataclass(frozen=True, slots=True)
class OutputObject:
    """One stored file of a finished task, as a download sees it."""

    #: proxy_mp4 | hls | thumbnail | waveform | original, or `hls` for each file a playlist names
    profile: str
    #: the stored file's own name (proxy.mp4, index.m3u8, seg_000.m4s, 0.mp4, ...): a plain name, no folders
    name: str
    #: where to read it: an object key (embedded) or a signed URL (remote)
    source: str
    #: what its asset row recorded; None for files without a row of their own (HLS segments)
    sha256: str | None = None
    size_bytes: int | None = None
    #: which output of a request for `n` it belongs to
    variant: int = 0


class TaskClient(GenerationClient, Protocol):
    def list_generations(self, status: str | None, limit: int) -> list[Snapshot]: ...

    def cancel(self, task_id: str) -> Snapshot: ...

    def models(self) -> list[dict[str, Any]]: ...

    def output_objects(self, task_id: str) -> list[OutputObject]:
        """The derivatives of a SUCCEEDED task (and, where this client may read it, the original output)."""
        ...

    def playlist(self, obj: OutputObject) -> tuple[bytes, list[OutputObject]]:
        """An HLS playlist as stored (the bytes its asset row's checksum covers) and the files it names."""
        ...

    def read(self, obj: OutputObject) -> Iterator[bytes]:
        """The object's bytes, in chunks; close the iterator to stop early."""
        ...


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
        raise ClientError(str(exc), exc.code) from None


class EmbeddedClient:
    def __init__(self, ctx: AppContext, principal: Principal) -> None:
        self._ctx = ctx
        self._principal = principal

    def default_model(self) -> str:
        spec = default_model(self._ctx.catalog)  # the model a project's cost estimate prices its clips with
        if spec is None:
            raise ClientError("no models are configured (see [providers] in aivedio.toml)")
        return spec.model

    def find(self, idempotency_key: str) -> Snapshot | None:
        with _refusals():
            task = self._ctx.generations.find_by_key(self._principal.tenant_id, idempotency_key)
        return None if task is None else self._snapshot(task)

    def upload(self, path: Path) -> str:
        with _refusals():
            return self._upload(_readable(path))

    def _upload(self, path: Path) -> str:
        assets = self._ctx.assets
        # the upload target (a signed engine URL or a presigned S3 request) is for remote clients: this process
        # writes the bytes to the session's staging key itself, so the same code works with every store
        view, _ = assets.create_upload(
            self._principal, path.name, path.stat().st_size, content_type_of(path), sha256_file(path)
        )
        with open(path, "rb") as f:
            assets.write_upload(self._principal, view.id, iter_file(f), content_length=path.stat().st_size)
        done = assets.complete(self._principal, view.id)
        if done.status != "READY":
            raise ClientError(f"{path.name} was rejected: {done.error or done.status}")
        return str(done.id)

    def create(self, body: dict[str, Any], idempotency_key: str) -> Snapshot:
        with _refusals():
            created = self._ctx.generations.create(self._principal.tenant_id, idempotency_key, body)
        return self._snapshot(created.task)

    def get(self, task_id: str) -> Snapshot:
        with _refusals():
            return self._snapshot(self._ctx.generations.get(self._principal.tenant_id, _task_uuid(task_id)))

    def list_generations(self, status: str | None, limit: int) -> list[Snapshot]:
        found: list[Snapshot] = []
        cursor = None
        with _refusals():
            while len(found) < limit:
                page, cursor = self._ctx.generations.list(
                    self._principal.tenant_id, status=status, limit=min(PAGE, limit - len(found)), cursor=cursor
                )
                found += self._snapshots(page)
                if cursor is None:
                    break
        return found

    def cancel(self, task_id: str) -> Snapshot:
        with _refusals():
            return self._snapshot(
                self._ctx.generations.cancel(self._principal.tenant_id, _task_uuid(task_id), requested_by="cli")
            )

    def models(self) -> list[dict[str, Any]]:
        from aivedio_engine.services.catalog import describe_models

        return describe_models(self._ctx.catalog)

    def output_objects(self, task_id: str) -> list[OutputObject]:
        tid, tenant = _task_uuid(task_id), self._principal.tenant_id
        produced = self._ctx.outputs.of_tasks(tenant, [tid]).get(tid)
        if produced is not None and len(produced.variants) > 1:
            return [
                OutputObject(f.profile, f.key.rsplit("/", 1)[-1], f.key, f.sha256, f.size_bytes, v.index)
                for v in produced.variants
                for f in (*v.files.values(), v.original)
            ]
        files = list(produced.files.values()) if produced is not None else []
        original = self._ctx.outputs.original(tenant, tid)
        return [
            OutputObject(f.profile, f.key.rsplit("/", 1)[-1], f.key, f.sha256, f.size_bytes)
            for f in (*files, *([original] if original else []))
        ]

    def playlist(self, obj: OutputObject) -> tuple[bytes, list[OutputObject]]:
        from aivedio_engine.services.outputs import MAX_PLAYLIST_BYTES, rewrite_playlist, safe_segment_name

        stored = _read_capped(self.read(obj), MAX_PLAYLIST_BYTES, obj.name)
        folder = obj.source.rsplit("/", 1)[0] + "/"
        names: list[str] = []

        def named(name: str) -> str:
            if not safe_segment_name(name):
                raise ClientError(f"{obj.name}: the playlist names {name[:80]!r}, not a file beside it")
            names.append(name)
            return name

        rewrite_playlist(stored.decode("utf-8", "replace"), named)
        return stored, [OutputObject(obj.profile, n, folder + n) for n in dict.fromkeys(names)]

    def read(self, obj: OutputObject) -> Iterator[bytes]:
        from aivedio_engine.storage.base import StoreError

        try:
            stream = self._ctx.storage.open_read(obj.source)
        except StoreError as exc:
            raise ClientError(f"{obj.name}: not in the object store ({type(exc).__name__})") from None
        with stream:
            yield from iter_file(stream)

    def changes(self, task_id: str, after_version: int) -> list[Snapshot]:
        """Every state change after `after_version`, from the stored history (none is missed between polls)."""
        from aivedio_engine.services import notifications

        events = notifications.history(self._ctx.engine, self._principal.tenant_id, uuid.UUID(task_id), after_version)
        return [Snapshot(task_id, e["status"], int(e["version"]), int(e["progress"] or 0)) for e in events]

    def _snapshot(self, task: TaskView) -> Snapshot:
        (snap,) = self._snapshots([task])
        return snap

    def _snapshots(self, tasks: list[TaskView]) -> list[Snapshot]:
        """What the CLI shows of `tasks`, with each SUCCEEDED one's outputs as files on this machine (the API's
        `views` with local paths for signed URLs); every task's outputs read in one statement."""
        outputs = self._ctx.outputs
        done = [t.id for t in tasks if t.status == TaskStatus.SUCCEEDED.value]
        produced = outputs.of_tasks(self._principal.tenant_id, done) if done else {}

        def local(files: dict[str, OutputFile]) -> dict[str, str]:
            return {p: str(outputs.local_path(f)) for p, f in files.items()}

        found = []
        for task in tasks:
            out = produced.get(task.id)
            found.append(
                Snapshot(
                    str(task.id),
                    task.status,
                    task.version,
                    task.progress,
                    task.last_error_class and f"{task.last_error_class}",
                    local(out.files) if out else {},
                    model=task.model,
                    provider=task.provider,
                    cancel_outcome=task.cancel_outcome,
                    created_at=_iso(task.created_at),
                    updated_at=_iso(task.updated_at),
                    finished_at=_iso(task.finished_at),
                    variants=[{"index": v.index, "outputs": local(v.files)} for v in out.variants] if out else [],
                )
            )
        return found

    def close(self) -> None:
        pass


class RemoteClient:
    def __init__(self, api_url: str, api_key: str, *, timeout_s: float = 30.0) -> None:
        from aivedio_engine.httpclient import HttpClient, Timeouts

        self._base = api_url.rstrip("/") + "/"
        self._http = HttpClient(
            self._base, Timeouts(read=timeout_s, write=timeout_s), headers={"Authorization": f"Bearer {api_key}"}
        )
        # upload targets carry their own credential: our API key must not travel to object storage
        self._bare = HttpClient(timeouts=Timeouts(read=timeout_s, write=timeout_s))

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        from aivedio_engine.httpclient import TransportError

        try:
            response = self._http.request(method, path, **kwargs)
        except TransportError as exc:
            raise ClientError(f"cannot reach {self._base}: {exc}") from None
        if response.status >= 400:
            raise ClientError(
                _problem_line(response.status, response.body), _problem_kind(response.status, response.body)
            )
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
        created = self._call(
            "POST",
            "v1/assets",
            json={
                "filename": path.name,
                "size_bytes": size,
                "content_type": content_type_of(path),
                "sha256": sha256_file(path),
            },
        )
        target = created["upload"]
        url = urljoin(self._base, target["url"])
        with open(path, "rb") as f:
            if target["method"] == "PUT":
                self._send("PUT", url, content=_chunks(f), headers={**target["headers"], "Content-Length": str(size)})
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
        return self._snapshot(
            self._call("POST", "v1/generations", json=body, headers={"Idempotency-Key": idempotency_key})
        )

    def get(self, task_id: str) -> Snapshot:
        return self._snapshot(self._get(task_id))

    def _get(self, task_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"v1/generations/{quote(task_id, safe='')}"))

    def list_generations(self, status: str | None, limit: int) -> list[Snapshot]:
        found: list[Snapshot] = []
        cursor: str | None = None
        while len(found) < limit:
            params = {
                k: v
                for k, v in {"status": status, "limit": min(PAGE, limit - len(found)), "cursor": cursor}.items()
                if v is not None
            }
            page = self._call("GET", "v1/generations", params=params)
            found += [self._snapshot(d) for d in page["data"]]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return found

    def cancel(self, task_id: str) -> Snapshot:
        return self._snapshot(self._call("POST", f"v1/generations/{quote(task_id, safe='')}/cancel"))

    def models(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "v1/models")["data"])

    def output_objects(self, task_id: str) -> list[OutputObject]:
        """The derivatives, by their signed URLs. Not the original: the API serves transcoded derivatives only."""
        doc = self._get(task_id)
        variants = doc.get("variants") or []
        if len(variants) <= 1:  # one output: the top-level `outputs` are it
            variants = [{"index": 0, "outputs": doc.get("outputs"), "output_assets": doc.get("output_assets")}]
        found = []
        for variant in variants:
            described = variant.get("output_assets") or {}
            for profile, url in sorted((variant.get("outputs") or {}).items()):
                row = described.get(profile) or {}
                found.append(
                    OutputObject(
                        profile,
                        _url_name(urljoin(self._base, url)),
                        urljoin(self._base, url),
                        row.get("sha256"),
                        row.get("size_bytes"),
                        int(variant.get("index") or 0),
                    )
                )
        return found

    def playlist(self, obj: OutputObject) -> tuple[bytes, list[OutputObject]]:
        """The served playlist names each file by a signed URL: put back the plain names to get the stored one."""
        from aivedio_engine.services.outputs import MAX_PLAYLIST_BYTES, rewrite_playlist, safe_segment_name

        served = _read_capped(self.read(obj), MAX_PLAYLIST_BYTES, obj.name).decode("utf-8", "replace")
        files: dict[str, OutputObject] = {}

        def named(uri: str) -> str:
            url = urljoin(obj.source, uri)
            name = _url_name(url)
            if not safe_segment_name(name) or urlsplit(url).scheme not in ("http", "https"):
                raise ClientError(f"{obj.name}: the playlist names {name[:80]!r}, not a segment of ours")
            files.setdefault(name, OutputObject(obj.profile, name, url))
            return name

        stored = rewrite_playlist(served, named)
        return stored.encode("utf-8"), list(files.values())

    def read(self, obj: OutputObject) -> Iterator[bytes]:
        """Signed URLs carry their own credential: they are read without our API key (it must not travel to
        object storage)."""
        from aivedio_engine.httpclient import TransportError

        try:
            with self._bare.stream("GET", obj.source) as response:
                if response.status_code != 200:
                    raise ClientError(f"{obj.name}: download failed: HTTP {response.status_code}")
                yield from response.iter_bytes(CHUNK)
        except TransportError as exc:
            raise ClientError(f"{obj.name}: download failed: {exc}") from None

    def _snapshot(self, doc: dict[str, Any]) -> Snapshot:
        outputs = {p: urljoin(self._base, u) for p, u in (doc.get("outputs") or {}).items()}
        variants = [
            {"index": int(v.get("index") or 0), "outputs": {p: urljoin(self._base, u) for p, u in v["outputs"].items()}}
            for v in doc.get("variants") or []
            if isinstance(v, dict) and isinstance(v.get("outputs"), dict)
        ]
        return Snapshot(
            str(doc["id"]),
            doc["status"],
            int(doc["version"]),
            int(doc["progress"]),
            doc.get("error_class"),
            outputs,
            model=doc.get("model"),
            provider=doc.get("provider"),
            cancel_outcome=doc.get("cancel_outcome"),
            created_at=doc.get("created_at"),
            updated_at=doc.get("updated_at"),
            finished_at=doc.get("finished_at"),
            variants=variants,
        )

    def close(self) -> None:
        self._http.close()
        self._bare.close()


def _chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


#: at most this many tasks per list request (the API's own limit)
PAGE = 200
#: problem slugs by HTTP status, for an answer whose body says nothing better
_STATUS_KINDS = {
    400: "bad-request",
    401: "unauthorized",
    402: "insufficient-credits",
    403: "forbidden",
    404: "not-found",
    409: "conflict",
    422: "invalid-request",
    503: "service-unavailable",
}


def _task_uuid(task_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(task_id)
    except ValueError:
        raise ClientError(f"not a generation id: {task_id!r}", "invalid-request") from None


def _iso(value: Any) -> str | None:
    return None if value is None else str(value.isoformat())


def _url_name(url: str) -> str:
    return unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])


def _read_capped(chunks: Iterator[bytes], limit: int, name: str) -> bytes:
    data = bytearray()
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                raise ClientError(f"{name}: larger than {limit} bytes, not a playlist of ours")
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return bytes(data)


def _problem_kind(status: int, body: bytes) -> str | None:
    import json

    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    kind = doc.get("type") if isinstance(doc, dict) else None
    if isinstance(kind, str) and "/problems/" in kind:
        return kind.rsplit("/", 1)[-1]
    return _STATUS_KINDS.get(status)


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
