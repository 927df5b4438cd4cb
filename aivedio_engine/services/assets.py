"""Input assets: upload sessions, direct uploads, and validation at `complete()` (seed 000 §4.4 一, §4.7.1).

The client declares name, size, type and optionally a SHA-256; we create the asset (UPLOADING) with a
server-generated key and hand out a short-lived upload target. Storage-side limits are not trusted (emulators and
some S3-compatible stores ignore POST policies, reliability_anchors §1.9), so `complete()` is the real control:
exact size, checksum, magic number, then ffprobe through the policy gate on a local copy. Anything refused
becomes REJECTED with the reason and its object is deleted; a missing object is a client error and leaves the
asset UPLOADING so the client can still upload.

No storage call and no ffprobe run inside a database transaction: `complete()` reads (tx A), works outside any
transaction, then writes with a compare-and-set on status UPLOADING (tx B), so two concurrent completes produce
one result and the loser returns the winner's.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import assets, upload_sessions
from aivedio_engine.domain.status import AssetKind, AssetStatus, UploadSessionStatus
from aivedio_engine.media import sniff
from aivedio_engine.media.probe import MediaLimits, ProbeError, ProbeResult, ProbeUnavailable, probe_file
from aivedio_engine.services.errors import (
    Conflict,
    Forbidden,
    IllegalState,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from aivedio_engine.services.tenants import Principal
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import (
    CHUNK,
    LocallySignedStore,
    ObjectNotFound,
    ObjectStore,
    ObjectTooLarge,
    StoredObject,
    UploadTarget,
)

CONTENT_TYPES: dict[str, AssetKind] = {
    "image/png": AssetKind.INPUT_IMAGE,
    "image/jpeg": AssetKind.INPUT_IMAGE,
    "image/webp": AssetKind.INPUT_IMAGE,
    "video/mp4": AssetKind.INPUT_VIDEO,
    "video/quicktime": AssetKind.INPUT_VIDEO,
    "video/webm": AssetKind.INPUT_VIDEO,
}
MAX_FILENAME = 255
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Unicode categories dropped from display names: controls (NUL...), format chars (RTL override), separators
_DROP = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}
_a = assets.c
_s = upload_sessions.c


@dataclass(frozen=True, slots=True)
class AssetView:
    id: uuid.UUID
    kind: str
    status: str
    filename: str | None
    size_bytes: int | None
    content_type: str | None
    sha256: str | None
    width: int | None
    height: int | None
    duration_ms: int | None
    frame_rate: str | None
    mime_detected: str | None
    error: str | None
    created_at: datetime
    ready_at: datetime | None


@dataclass(frozen=True, slots=True)
class _Outcome:
    status: AssetStatus
    reason: str | None = None
    size: int | None = None
    sha256: str | None = None
    mime: str | None = None
    probe: ProbeResult | None = None


def display_name(filename: str) -> str:
    """A harmless display name: last path component, no control/format characters. Never used in a key."""
    name = re.split(r"[/\\]", filename)[-1]
    name = "".join(c for c in name if unicodedata.category(c) not in _DROP).strip().strip(".").strip()
    return name or "upload"


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _parse_id(value: uuid.UUID | str) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise NotFound("asset not found") from None


class AssetService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings, store: ObjectStore) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._store = store
        self._limits = MediaLimits.from_settings(settings.media)
        self._work_dir = Path(settings.data_dir) / "tmp"

    # --- create --------------------------------------------------------------------------------------------

    def create_upload(self, principal: Principal, filename: str, size_bytes: int, content_type: str,
                      sha256: str | None = None) -> tuple[AssetView, UploadTarget]:
        if not isinstance(filename, str) or not 0 < len(filename) <= MAX_FILENAME:
            raise InvalidInput(f"filename must be 1-{MAX_FILENAME} characters", field="filename")
        max_bytes = self._settings.api.max_upload_bytes
        if not isinstance(size_bytes, int) or isinstance(size_bytes, bool) or not 0 < size_bytes <= max_bytes:
            raise InvalidInput(f"size_bytes must be between 1 and {max_bytes}", field="size_bytes")
        ctype = content_type.strip().lower() if isinstance(content_type, str) else ""
        if ctype not in CONTENT_TYPES:
            raise InvalidInput(f"content_type must be one of {', '.join(CONTENT_TYPES)}", field="content_type")
        digest = sha256.strip().lower() if isinstance(sha256, str) else sha256
        if digest is not None and not _SHA256.fullmatch(digest):
            raise InvalidInput("sha256 must be 64 hex characters", field="sha256")

        now = self._clock.now()
        asset_id, session_id = new_id(), new_id()
        key = keys.asset_original_key(principal.tenant_id, asset_id, ctype)
        ttl = self._settings.storage.upload_url_ttl_s
        with write_tx(self._engine) as conn:
            conn.execute(assets.insert().values(
                id=asset_id, tenant_id=principal.tenant_id, kind=CONTENT_TYPES[ctype].value,
                status=AssetStatus.UPLOADING.value, bucket=self._store.bucket, object_key=key, size_bytes=size_bytes,
                # the schema has no filename column; the display name rides in the probe document
                probe={"upload": {"filename": display_name(filename)}}, created_at=now,
            ))
            conn.execute(upload_sessions.insert().values(
                id=session_id, tenant_id=principal.tenant_id, asset_id=asset_id,
                status=UploadSessionStatus.OPEN.value, object_key=key, declared_size_bytes=size_bytes,
                declared_content_type=ctype, declared_sha256=digest, expires_at=now + timedelta(seconds=ttl),
                created_at=now,
            ))
        target = self._store.upload_target(key, size_bytes, ctype, ttl, upload_id=str(session_id), now=now)
        return self.get(principal, asset_id), target

    # --- read ----------------------------------------------------------------------------------------------

    def get(self, principal: Principal, asset_id: uuid.UUID | str) -> AssetView:
        with self._engine.connect() as conn:
            row = self._row(conn, principal, _parse_id(asset_id))
        return self._view(row)

    def _row(self, conn: sa.Connection, principal: Principal, asset_id: uuid.UUID) -> Any:
        declared = (
            sa.select(_s.declared_content_type).where(_s.asset_id == _a.id)
            .order_by(_s.created_at.desc()).limit(1).scalar_subquery()
        )
        row = conn.execute(
            sa.select(assets, declared.label("declared_content_type"))
            .where(_a.id == asset_id, _a.tenant_id == principal.tenant_id)
        ).first()
        if row is None:  # another tenant's asset reads exactly like a missing one
            raise NotFound("asset not found")
        return row

    @staticmethod
    def _view(row: Any) -> AssetView:
        probe = row.probe or {}
        rate = f"{row.frame_rate_num}/{row.frame_rate_den}" if row.frame_rate_num and row.frame_rate_den else None
        return AssetView(
            id=row.id, kind=row.kind, status=row.status, filename=(probe.get("upload") or {}).get("filename"),
            size_bytes=row.size_bytes, content_type=row.declared_content_type or row.mime_detected,
            sha256=row.checksum_value if row.checksum_algorithm == "sha256" else None,
            width=row.width, height=row.height, duration_ms=row.duration_ms, frame_rate=rate,
            mime_detected=row.mime_detected, error=row.error, created_at=_aware(row.created_at),
            ready_at=_aware(row.ready_at) if row.ready_at else None,
        )

    # --- complete ------------------------------------------------------------------------------------------

    def complete(self, principal: Principal, asset_id: uuid.UUID | str) -> AssetView:
        asset_id = _parse_id(asset_id)
        with self._engine.connect() as conn:  # tx A: read only
            row = self._row(conn, principal, asset_id)
            if row.status != AssetStatus.UPLOADING.value:
                return self._view(row)  # READY / REJECTED: completing again is a no-op
            session = conn.execute(
                sa.select(upload_sessions).where(_s.asset_id == asset_id).order_by(_s.created_at.desc()).limit(1)
            ).first()
        if session is None or session.status != UploadSessionStatus.OPEN.value:
            raise IllegalState("the asset has no open upload session")

        outcome = self._validate(row.object_key, session)  # storage and ffprobe, outside any transaction

        now = self._clock.now()
        values: dict[str, Any] = {
            "status": outcome.status.value, "error": outcome.reason, "mime_detected": outcome.mime,
            "size_bytes": outcome.size if outcome.size is not None else row.size_bytes,
            "checksum_algorithm": "sha256" if outcome.sha256 else None, "checksum_value": outcome.sha256,
        }
        if outcome.probe is not None:
            video = outcome.probe.video
            is_video = CONTENT_TYPES[session.declared_content_type] is AssetKind.INPUT_VIDEO
            rate = video.frame_rate if video is not None and is_video else None
            values.update(
                width=video.width if video else None, height=video.height if video else None,
                duration_ms=outcome.probe.duration_ms if is_video else None,
                frame_rate_num=rate.numerator if rate else None, frame_rate_den=rate.denominator if rate else None,
                probe={**(row.probe or {}), "ffprobe": outcome.probe.raw},
            )
        if outcome.status is AssetStatus.READY:
            values["ready_at"] = now
        with write_tx(self._engine) as conn:  # tx B: compare-and-set on UPLOADING
            won = conn.execute(
                assets.update().where(_a.id == asset_id, _a.tenant_id == principal.tenant_id,
                                      _a.status == AssetStatus.UPLOADING.value).values(**values)
            ).rowcount == 1
            if won:
                conn.execute(
                    upload_sessions.update()
                    .where(_s.id == session.id, _s.status == UploadSessionStatus.OPEN.value)
                    .values(status=UploadSessionStatus.COMPLETED.value, completed_at=now)
                )
        if won and outcome.status is AssetStatus.REJECTED:
            self._discard(row.object_key)
        return self.get(principal, asset_id)

    def _validate(self, key: str, session: Any) -> _Outcome:
        declared = int(session.declared_size_bytes)
        head = self._store.head(key)
        if head is None:
            raise InvalidInput("object not uploaded")
        if head.size != declared:
            return _Outcome(AssetStatus.REJECTED, f"size mismatch: declared {declared} bytes, uploaded {head.size}",
                            size=head.size)
        self._work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="validate-", dir=self._work_dir) as tmp:
            local = Path(tmp) / "input"  # no extension: ffprobe must pick the demuxer from the bytes alone
            try:
                size = self._store.download_to(key, local)
            except ObjectNotFound:
                raise InvalidInput("object not uploaded") from None
            with open(local, "rb") as f:
                digest, head_bytes = _sha256_and_head(f)
            if size != declared:  # replaced between HEAD and download
                return _Outcome(AssetStatus.REJECTED, f"size mismatch: declared {declared} bytes, uploaded {size}",
                                size=size, sha256=digest)
            if session.declared_sha256 and session.declared_sha256 != digest:
                return _Outcome(AssetStatus.REJECTED, "sha256 mismatch: the uploaded bytes differ from the declared "
                                "checksum", size=size, sha256=digest)
            found, reason = sniff.check_declared(head_bytes, session.declared_content_type)
            if reason:
                return _Outcome(AssetStatus.REJECTED, reason, size=size, sha256=digest, mime=found.mime)
            try:
                result = probe_file(local, sniff.family_of(session.declared_content_type), self._limits)
            except ProbeUnavailable as exc:
                raise Unavailable(f"media validation unavailable: {exc}") from None
            except ProbeError as exc:
                return _Outcome(AssetStatus.REJECTED, f"media rejected: {exc}", size=size, sha256=digest,
                                mime=found.mime)
        return _Outcome(AssetStatus.READY, size=size, sha256=digest, mime=found.mime, probe=result)

    def _discard(self, key: str) -> None:
        """Rejected bytes are attacker-controlled: do not keep hosting them. Best effort — the sweeper's orphan
        GC removes objects of REJECTED assets that survive a failed delete."""
        try:
            self._store.delete(key)
        except Exception:  # noqa: BLE001 - the rejection is already recorded; deletion is housekeeping
            pass

    # --- fs uploads and downloads (served by the API) ------------------------------------------------------

    def receive_upload(self, upload_id: str, expires: int, sig: str, chunks: Iterable[bytes],
                       content_length: int | None = None) -> StoredObject:
        """Body of a signed `PUT /v1/uploads/{id}` (fs store): the signature is the credential; the declared
        size is the cap, enforced from Content-Length up front and again while streaming."""
        store = self._store
        if not isinstance(store, LocallySignedStore):
            raise NotFound("uploads go directly to object storage")
        now = self._clock.now()
        try:
            session_id = uuid.UUID(upload_id)
        except ValueError:
            raise Forbidden("invalid upload signature") from None
        if not store.verify("PUT", f"uploads/{session_id}", expires, sig, now=now):
            raise Forbidden("invalid or expired upload signature")
        with self._engine.connect() as conn:
            session = conn.execute(sa.select(upload_sessions).where(_s.id == session_id)).first()
        if session is None:
            raise NotFound("upload not found")
        if session.status != UploadSessionStatus.OPEN.value:
            # after complete() the validated bytes must not be replaced (TOCTOU, reliability_anchors U5)
            raise Conflict("the upload session is closed")
        if _aware(session.expires_at) < now:
            raise Forbidden("the upload URL has expired")
        declared = int(session.declared_size_bytes)
        if content_length is not None and content_length > declared:
            raise PayloadTooLarge(f"body is larger than the declared {declared} bytes")
        try:
            return store.put_stream(session.object_key, chunks, session.declared_content_type, max_bytes=declared)
        except ObjectTooLarge:
            raise PayloadTooLarge(f"body is larger than the declared {declared} bytes") from None

    def open_signed_object(self, key: str, expires: int, sig: str,
                           filename: str | None = None) -> tuple[StoredObject, IO[bytes]]:
        """A signed `GET /v1/objects/{key}` (fs store): (object facts, open stream the caller closes)."""
        store = self._store
        if not isinstance(store, LocallySignedStore):
            raise NotFound("object not found")
        try:
            keys.validate_key(key)
        except keys.InvalidKey:
            raise Forbidden("invalid signature") from None
        if not store.verify("GET", f"objects/{key}", expires, sig, filename=filename, now=self._clock.now()):
            raise Forbidden("invalid or expired signature")
        head = store.head(key)
        if head is None:
            raise NotFound("object not found")
        try:
            return head, store.open_read(key)
        except ObjectNotFound:
            raise NotFound("object not found") from None


def _sha256_and_head(stream: IO[bytes]) -> tuple[str, bytes]:
    digest = hashlib.sha256()
    first = stream.read(sniff.HEAD_BYTES)
    digest.update(first)
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest(), first
