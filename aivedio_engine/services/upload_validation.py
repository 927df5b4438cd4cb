"""What `AssetService.complete()` does outside any transaction: verify an uploaded object and, when it passes,
publish the validated bytes under a key no client can write.

Checks, cheapest first: exact size (HEAD, then again on the downloaded copy, because the object may be replaced
in between), declared SHA-256, magic number, then ffprobe through the policy gate. Every check runs on one local
copy, and the published object is made from that same copy, so what is processed later is byte for byte what
was validated (U5), whatever the client does with its still-valid upload URL.
"""

from __future__ import annotations

import hashlib
import tempfile
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from aivedio_engine.domain.status import AssetStatus
from aivedio_engine.media import sniff
from aivedio_engine.media.probe import MediaLimits, ProbeError, ProbeResult, ProbeUnavailable, probe_file
from aivedio_engine.services.errors import InvalidInput, Unavailable
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import CHUNK, ObjectNotFound, ObjectStore, StoredObject, StoreError, iter_file


@dataclass(frozen=True, slots=True)
class Outcome:
    status: AssetStatus
    reason: str | None = None
    size: int | None = None
    sha256: str | None = None
    mime: str | None = None
    probe: ProbeResult | None = None
    #: READY only: where the validated bytes were published
    published: str | None = None


def discard(store: ObjectStore, key: str) -> None:
    """Best effort: the abandoned-upload GC and the bucket lifecycle rule catch what a failed delete leaves."""
    try:
        store.delete(key)
    except Exception:  # noqa: BLE001 - the outcome is already recorded; deletion is housekeeping
        pass


class UploadValidator:
    def __init__(self, store: ObjectStore, limits: MediaLimits, work_dir: Path) -> None:
        self._store = store
        self._limits = limits
        self._work_dir = work_dir

    def validate(self, asset: Any, session: Any, head: StoredObject, revision: uuid.UUID) -> Outcome:
        """REJECTED with a reason, or READY with the published key. Raises InvalidInput when the object is
        gone (the client may upload again) and Unavailable when ffprobe itself is broken (our fault)."""
        declared = int(session.declared_size_bytes)
        if head.size != declared:
            return Outcome(
                AssetStatus.REJECTED, f"size mismatch: declared {declared} bytes, uploaded {head.size}", size=head.size
            )
        self._work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="validate-", dir=self._work_dir) as tmp:
            local = Path(tmp) / "input"  # no extension: ffprobe must pick the demuxer from the bytes alone
            try:
                size = self._store.download_to(session.object_key, local)
            except ObjectNotFound:
                raise InvalidInput("object not uploaded") from None
            with open(local, "rb") as f:
                digest, head_bytes = _sha256_and_head(f)
            if size != declared:  # replaced between HEAD and download
                return Outcome(
                    AssetStatus.REJECTED,
                    f"size mismatch: declared {declared} bytes, uploaded {size}",
                    size=size,
                    sha256=digest,
                )
            if session.declared_sha256 and session.declared_sha256 != digest:
                return Outcome(
                    AssetStatus.REJECTED,
                    "sha256 mismatch: the uploaded bytes differ from the declared checksum",
                    size=size,
                    sha256=digest,
                )
            found, reason = sniff.check_declared(head_bytes, session.declared_content_type)
            if reason:
                return Outcome(AssetStatus.REJECTED, reason, size=size, sha256=digest, mime=found.mime)
            try:
                limits = replace(self._limits, workdir=Path(tmp))  # the sandbox may give the job a uid of its own
                result = probe_file(local, sniff.family_of(session.declared_content_type), limits)
            except ProbeUnavailable as exc:
                raise Unavailable(f"media validation unavailable: {exc}") from None
            except ProbeError as exc:
                return Outcome(
                    AssetStatus.REJECTED, f"media rejected: {exc}", size=size, sha256=digest, mime=found.mime
                )
            published = self._publish(asset, session, local, digest, revision)
        return Outcome(AssetStatus.READY, size=size, sha256=digest, mime=found.mime, probe=result, published=published)

    def _publish(self, asset: Any, session: Any, local: Path, digest: str, revision: uuid.UUID) -> str:
        """Stored with our content type and no Content-Encoding, whatever the client sent with its upload, so
        nothing downstream ever decompresses client-chosen bytes (U29)."""
        key = keys.asset_original_key(asset.tenant_id, asset.id, session.declared_content_type, revision)
        with open(local, "rb") as f:
            stored = self._store.put_stream(
                key, iter_file(f), session.declared_content_type, max_bytes=int(session.declared_size_bytes)
            )
        if stored.sha256 != digest:  # the local copy changed under us: publish nothing rather than the unknown
            discard(self._store, key)
            raise StoreError(f"published copy of {asset.id} does not match the validated bytes")
        return key


def _sha256_and_head(stream: IO[bytes]) -> tuple[str, bytes]:
    digest = hashlib.sha256()
    first = stream.read(sniff.HEAD_BYTES)
    digest.update(first)
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest(), first
