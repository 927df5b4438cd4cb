"""Input assets: upload sessions, direct uploads, and validation at `complete()`.

The client declares name, size, type and optionally a SHA-256 (and, on S3, a part count for a multipart
upload); we create the asset (UPLOADING) and hand out a short-lived target for a server-generated staging key,
`tenants/{tid}/uploads/{session}`. Storage-side limits are not trusted (emulators and some S3-compatible stores
ignore POST policies), so `complete()` is the real control: exact size, checksum,
magic number, then ffprobe through the policy gate on a local copy. Anything refused becomes REJECTED with the
reason; a missing object is a client error and leaves the asset UPLOADING so the client can still upload.

Processed bytes are validated bytes (U5): an upload URL stays usable until it expires, so the staging key is
never processed. The validated local copy itself is published under a per-validation key no client can write,
and only that key is recorded. One validation per asset (U25): `complete()` claims the asset (UPLOADING →
VALIDATING) before the expensive work, so replays and concurrent calls cannot multiply ffprobe runs; a claim
whose holder died is taken over after `_claim_ttl_s`.

No storage call and no ffprobe run inside a database transaction: claim (tx), work outside any transaction,
then a compare-and-set on VALIDATING (tx).
"""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import uploads
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import AssetKind, AssetStatus, UploadSessionStatus
from aivedio_engine.media.probe import MediaLimits
from aivedio_engine.services.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    IllegalState,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ServiceError,
)
from aivedio_engine.services.quarantine import clear_quarantine
from aivedio_engine.services.tenants import Principal
from aivedio_engine.services.upload_validation import UploadValidator, discard
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import (
    LocallySignedStore,
    MultipartStore,
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
class PartUrls:
    """Multipart upload target: PUT part n to `urls[n - 1]`, then call complete."""

    urls: list[str]
    expires_at: datetime


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


class RateLimited(ServiceError):
    """Too many upload sessions opened by one tenant in the last minute (U30); the API answers 429."""

    code = "rate-limited"


class AssetService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings, store: ObjectStore) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._store = store
        self._limits = MediaLimits.from_settings(settings.media)
        self._validator = UploadValidator(store, self._limits, Path(settings.data_dir) / "tmp")
        # a validation is bounded by ffprobe's timeout plus a download and a publish of the same bytes
        self._claim_ttl_s = 3 * self._limits.timeout_s

    # --- create --------------------------------------------------------------------------------------------

    def create_upload(
        self,
        principal: Principal,
        filename: str,
        size_bytes: int,
        content_type: str,
        sha256: str | None = None,
        parts: int | None = None,
    ) -> tuple[AssetView, UploadTarget | PartUrls]:
        if not isinstance(filename, str) or not 0 < len(filename) <= MAX_FILENAME:
            raise InvalidInput(f"filename must be 1-{MAX_FILENAME} characters", field="filename")
        max_bytes = self._upload_cap(principal)
        if not isinstance(size_bytes, int) or isinstance(size_bytes, bool) or size_bytes <= 0:
            raise InvalidInput(f"size_bytes must be between 1 and {max_bytes}", field="size_bytes")
        if size_bytes > max_bytes:
            raise PayloadTooLarge(
                f"size_bytes {size_bytes} exceeds the upload limit of {max_bytes} bytes", field="size_bytes"
            )
        ctype = content_type.strip().lower() if isinstance(content_type, str) else ""
        if ctype not in CONTENT_TYPES:
            raise InvalidInput(f"content_type must be one of {', '.join(CONTENT_TYPES)}", field="content_type")
        digest = sha256.strip().lower() if isinstance(sha256, str) else sha256
        if digest is not None and not _SHA256.fullmatch(digest):
            raise InvalidInput("sha256 must be 64 hex characters", field="sha256")
        if parts is not None:
            self._check_parts(size_bytes, parts)

        now = self._clock.now()
        asset_id, session_id = new_id(), new_id()
        key = keys.upload_staging_key(principal.tenant_id, session_id)
        ttl = self._settings.storage.upload_url_ttl_s
        with write_tx(self._engine) as conn:
            self._check_rate(conn, principal, now)
            uploads.create(
                conn,
                asset_id=asset_id,
                session_id=session_id,
                tenant_id=principal.tenant_id,
                kind=CONTENT_TYPES[ctype].value,
                bucket=self._store.bucket,
                key=key,
                size_bytes=size_bytes,
                content_type=ctype,
                sha256=digest,
                # the schema has no filename column; the display name rides in the probe document
                probe={"upload": {"filename": display_name(filename)}},
                expires_at=now + timedelta(seconds=ttl),
                now=now,
            )
        target: UploadTarget | PartUrls
        if parts is None:
            target = self._store.upload_target(key, size_bytes, ctype, ttl, upload_id=str(session_id), now=now)
        else:
            target = self._multipart_target(session_id, key, ctype, parts, ttl, now)
        return self.get(principal, asset_id), target

    def _upload_cap(self, principal: Principal) -> int:
        """The tenant's plan cap when it has one, else the platform's (U2)."""
        with self._engine.connect() as conn:
            cap = uploads.upload_cap(conn, principal.tenant_id)
        return cap or self._settings.api.max_upload_bytes

    def _check_rate(self, conn: Connection, principal: Principal, now: datetime) -> None:
        """At most `limits.uploads_per_tenant_per_min` sessions per tenant per sliding minute. Counted from the
        assets table (index tenant_id, created_at), so the limit holds across API processes in both modes; the
        tenant row lock serialises one tenant's creates on PostgreSQL (SQLite's write lock already does)."""
        limit = self._settings.limits.uploads_per_tenant_per_min
        oldest_counted = uploads.rate_window(
            conn,
            principal.tenant_id,
            since=now - timedelta(seconds=60),
            kinds=[k.value for k in set(CONTENT_TYPES.values())],
            limit=limit,
        )
        if oldest_counted is not None:
            wait = max(1, math.ceil((_aware(oldest_counted) + timedelta(seconds=60) - now).total_seconds()))
            raise RateLimited(
                f"more than {limit} uploads started in the last minute; retry in {wait}s", retry_after=wait
            )

    def _check_parts(self, size_bytes: int, parts: Any) -> None:
        """Multipart bounds at initiate (U22): every part but the last is ≥ 5 MiB, so more than size/5 MiB + 1
        parts cannot be a real upload, only a way to mint URLs; S3 itself stops at 10,000. A part count that
        cannot describe the declared size is a malformed request (400), like S3's own answer to it."""
        if not isinstance(self._store, MultipartStore):
            raise InvalidInput("multipart uploads need the s3 store; upload in one request instead", field="parts")
        from aivedio_engine.storage.s3 import MAX_PARTS, MIN_PART_BYTES  # boto3 is loaded only with S3

        most = min(MAX_PARTS, size_bytes // MIN_PART_BYTES + 1)
        if not isinstance(parts, int) or isinstance(parts, bool) or not 1 <= parts <= most:
            raise BadRequest(
                f"parts must be between 1 and {most} for {size_bytes} bytes (parts other than the "
                f"last are at least {MIN_PART_BYTES} bytes; at most {MAX_PARTS} parts)",
                field="parts",
            )

    def _multipart_target(
        self, session_id: uuid.UUID, key: str, ctype: str, parts: int, ttl: int, now: datetime
    ) -> PartUrls:
        store = self._store
        assert isinstance(store, MultipartStore)  # checked by _check_parts
        upload_id = store.create_multipart(key, ctype)
        with write_tx(self._engine) as conn:
            uploads.set_multipart_id(conn, session_id, upload_id)
        return PartUrls(store.presign_parts(key, upload_id, parts, ttl), now + timedelta(seconds=ttl))

    # --- read ----------------------------------------------------------------------------------------------

    def get(self, principal: Principal, asset_id: uuid.UUID | str) -> AssetView:
        with self._engine.connect() as conn:
            row = self._row(conn, principal, _parse_id(asset_id))
        return self._view(row)

    def _row(self, conn: Connection, principal: Principal, asset_id: uuid.UUID) -> uploads.UploadedAsset:
        row = uploads.asset_of(conn, principal.tenant_id, asset_id)
        if row is None:  # another tenant's asset reads exactly like a missing one
            raise NotFound("asset not found")
        return row

    @staticmethod
    def _view(row: uploads.UploadedAsset) -> AssetView:
        probe = row.probe or {}
        rate = f"{row.frame_rate_num}/{row.frame_rate_den}" if row.frame_rate_num and row.frame_rate_den else None
        return AssetView(
            id=row.id,
            kind=row.kind,
            status=row.status,
            filename=(probe.get("upload") or {}).get("filename"),
            size_bytes=row.size_bytes,
            content_type=row.declared_content_type or row.mime_detected,
            sha256=row.checksum_value if row.checksum_algorithm == "sha256" else None,
            width=row.width,
            height=row.height,
            duration_ms=row.duration_ms,
            frame_rate=rate,
            mime_detected=row.mime_detected,
            error=row.error,
            created_at=_aware(row.created_at),
            ready_at=_aware(row.ready_at) if row.ready_at else None,
        )

    # --- complete ------------------------------------------------------------------------------------------

    def complete(self, principal: Principal, asset_id: uuid.UUID | str) -> AssetView:
        asset_id = _parse_id(asset_id)
        with self._engine.connect() as conn:  # read only
            row = self._row(conn, principal, asset_id)
            session = uploads.latest_session(conn, asset_id)
        now = self._clock.now()
        if row.status not in (AssetStatus.UPLOADING.value, AssetStatus.VALIDATING.value) or (
            row.status == AssetStatus.VALIDATING.value and not self._claim_expired(row, now)
        ):
            return self._view(row)  # done, or being validated by another call: completing again is a no-op
        if session is None or session.status != UploadSessionStatus.OPEN.value:
            raise IllegalState("the asset has no open upload session")
        head = self._uploaded(session)  # before claiming: "not uploaded yet" must leave the asset UPLOADING

        revision = new_id()
        claim = {**(row.probe or {}), "validation": {"started_at": now.isoformat(), "revision": str(revision)}}
        with write_tx(self._engine) as conn:
            if not uploads.claim(conn, asset_id, row.status, claim):
                return self.get(principal, asset_id)  # another call claimed it first
        try:
            outcome = self._validator.validate(row, session, head, revision)
        except BaseException:
            unclaimed = {k: v for k, v in claim.items() if k != "validation"}
            with write_tx(self._engine) as conn:  # our fault (ffprobe missing, storage down): let the client retry
                uploads.unclaim(conn, asset_id, unclaimed)
            raise

        now = self._clock.now()
        values: dict[str, Any] = {
            "status": outcome.status.value,
            "error": outcome.reason,
            "mime_detected": outcome.mime,
            "size_bytes": outcome.size if outcome.size is not None else row.size_bytes,
            "checksum_algorithm": "sha256" if outcome.sha256 else None,
            "checksum_value": outcome.sha256,
            "probe": {k: v for k, v in claim.items() if k != "validation"},
        }
        if outcome.probe is not None:
            video = outcome.probe.video
            is_video = CONTENT_TYPES[session.declared_content_type] is AssetKind.INPUT_VIDEO
            rate = video.frame_rate if video is not None and is_video else None
            values.update(
                width=video.width if video else None,
                height=video.height if video else None,
                duration_ms=outcome.probe.duration_ms if is_video else None,
                frame_rate_num=rate.numerator if rate else None,
                frame_rate_den=rate.denominator if rate else None,
                probe={**values["probe"], "ffprobe": outcome.probe.raw},
            )
        if outcome.published:
            values.update(object_key=outcome.published, ready_at=now)
        with write_tx(self._engine) as conn:  # compare-and-set on our claim
            won = uploads.finish_validation(
                conn, asset_id=asset_id, tenant_id=principal.tenant_id, session_id=session.id, values=values, now=now
            )
        if outcome.published:
            # promoted: the quarantined original has served its purpose. A rejected one stays in quarantine for
            # `sweeper.rejected_upload_grace_s` (an operator may look at it), then services/quarantine.py deletes it.
            clear_quarantine(self._engine, self._store, session.id, session.object_key, now)
            if not won:
                discard(self._store, outcome.published)
        return self.get(principal, asset_id)

    def _claim_expired(self, row: uploads.UploadedAsset, now: datetime) -> bool:
        started: Any = ((row.probe or {}).get("validation") or {}).get("started_at")
        try:
            return now - _aware(datetime.fromisoformat(started)) > timedelta(seconds=self._claim_ttl_s)
        except (TypeError, ValueError):
            return True  # a VALIDATING row without a readable claim can only be taken over

    def _uploaded(self, session: uploads.UploadSession) -> StoredObject:
        """The uploaded object's facts; a multipart upload is completed here, from the parts S3 recorded."""
        key, store = session.object_key, self._store
        head = store.head(key)
        if head is None and session.multipart_upload_id and isinstance(store, MultipartStore):
            try:
                head = store.complete_uploaded_parts(key, session.multipart_upload_id)  # type: ignore[attr-defined]
            except ObjectNotFound:
                raise InvalidInput("multipart upload incomplete: upload every part, then complete") from None
        if head is None:
            raise InvalidInput("object not uploaded")
        return head

    # --- abandoned uploads (U23) ---------------------------------------------------------------------------

    def expire_abandoned_uploads(self, older_than_s: float = 86_400, batch: int = 500) -> int:
        """Sessions whose upload URL expired more than `older_than_s` ago without a completed upload: the
        asset becomes REJECTED, the session EXPIRED, an open multipart upload is aborted (its parts are billed
        storage) and any staging object deleted. Returns how many were expired."""
        cutoff = self._clock.now() - timedelta(seconds=older_than_s)
        with self._engine.connect() as conn:
            stale = uploads.abandoned(conn, cutoff, batch)
        expired = 0
        for session in stale:
            with write_tx(self._engine) as conn:  # a concurrent complete() claims UPLOADING first, or loses here
                if not uploads.expire_abandoned(
                    conn, session, "upload abandoned: not completed before the upload URL expired"
                ):
                    continue
            expired += 1
            if session.multipart_upload_id and isinstance(self._store, MultipartStore):
                try:
                    self._store.abort_multipart(session.object_key, session.multipart_upload_id)
                except Exception:  # noqa: BLE001 - the bucket's abort-incomplete-multipart rule is the backstop
                    pass
            clear_quarantine(self._engine, self._store, session.id, session.object_key, self._clock.now())
        return expired

    # --- fs uploads and downloads (served by the API) ------------------------------------------------------

    def receive_upload(
        self, upload_id: str, expires: int, sig: str, chunks: Iterable[bytes], content_length: int | None = None
    ) -> StoredObject:
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
            session = uploads.session(conn, session_id)
        if session is None:
            raise NotFound("upload not found")
        if session.status != UploadSessionStatus.OPEN.value:
            # after complete() the validated bytes must not be replaced (TOCTOU U5)
            raise Conflict("the upload session is closed")
        if _aware(session.expires_at) < now:
            raise Forbidden("the upload URL has expired")
        return self._write(session, chunks, content_length)

    def write_upload(
        self, principal: Principal, asset_id: uuid.UUID, chunks: Iterable[bytes], content_length: int | None = None
    ) -> StoredObject:
        """The bytes of an upload written by the engine's own process (the embedded client, a workflow step's
        shot image): straight to the session's staging key in whichever store is configured. A signed URL is how
        a remote client proves it may write; an in-process caller holds the principal, and S3 has no local URL it
        could call (`receive_upload` exists only for the fs store). The same open-session and size rules apply."""
        with self._engine.connect() as conn:
            self._row(conn, principal, asset_id)  # NotFound for another tenant's asset
            session = uploads.latest_session(conn, asset_id)
        if session is None or session.status != UploadSessionStatus.OPEN.value:
            raise Conflict("the asset has no open upload session")
        if _aware(session.expires_at) < self._clock.now():
            raise Forbidden("the upload session has expired")
        return self._write(session, chunks, content_length)

    def _write(
        self, session: uploads.UploadSession, chunks: Iterable[bytes], content_length: int | None
    ) -> StoredObject:
        declared = int(session.declared_size_bytes)
        if content_length is not None and content_length > declared:
            raise PayloadTooLarge(f"body is larger than the declared {declared} bytes")
        try:
            return self._store.put_stream(session.object_key, chunks, session.declared_content_type, max_bytes=declared)
        except ObjectTooLarge:
            raise PayloadTooLarge(f"body is larger than the declared {declared} bytes") from None

    def open_signed_object(
        self, key: str, expires: int, sig: str, filename: str | None = None
    ) -> tuple[StoredObject, IO[bytes]]:
        """A signed `GET /v1/objects/{key}` (fs store): (object facts, open stream the caller closes)."""
        store = self._store
        if not isinstance(store, LocallySignedStore):
            raise NotFound("object not found")
        try:
            keys.validate_key(key)
        except keys.InvalidKey:
            raise Forbidden("invalid signature") from None
        if keys.is_quarantined(key):  # no URL is ever signed for one; refuse even a forged or legacy one
            raise Forbidden("invalid signature")
        if not store.verify("GET", f"objects/{key}", expires, sig, filename=filename, now=self._clock.now()):
            raise Forbidden("invalid or expired signature")
        head = store.head(key)
        if head is None:
            raise NotFound("object not found")
        try:
            return head, store.open_read(key)
        except ObjectNotFound:
            raise NotFound("object not found") from None
