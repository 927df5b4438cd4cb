"""The object store contract shared by the fs and s3 implementations (one contract test suite runs both).

Rules every implementation keeps:
- keys are validated (`keys.validate_key`) before anything touches storage;
- `put_stream` hashes while it writes, never holds the whole object in memory, enforces `max_bytes` while
  writing and publishes atomically: readers see the old object or the complete new one, never a prefix, and
  an aborted write (cap exceeded, producer error) leaves the key exactly as it was;
- overwrite policy: a successful `put_stream` replaces an existing object under the same key (S3 semantics;
  keys are server-generated and immutable-by-convention, e.g. derivatives carry their pipeline version);
- `delete` of a missing key is not an error (S3 semantics), so retried cleanups are harmless;
- signed URLs and upload targets are bearer tokens: short-lived, bound to one key (or upload) and one method;
  no signed GET URL is made for a quarantined key (`readable_key`): only the upload validator reads those;
- `iter_objects` streams what the store holds (page by page, never the whole listing in memory), in no
  promised order, and leaves out the store's own bookkeeping (the fs store's `.tmp`/`.meta`), which no key can
  name; it exists for the orphan scan (services/storage_scan.py), not for serving.

Uploads from clients: the s3 store hands out a presigned POST whose policy pins the exact key, an exact
content-length-range and the Content-Type; the fs store hands out a signed PUT URL on the API
(`/v1/uploads/{upload_id}`), whose handler streams the body into `put_stream` with the declared size as cap.
Multipart (S3 only, `MultipartStore`) is for objects above what one request should carry; the fs store has no
multipart because its single PUT is already streamed to disk with no size ceiling besides the declared size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Protocol, runtime_checkable
from urllib.parse import quote

from aivedio_engine.storage.keys import InvalidKey, is_quarantined, validate_key

#: read size for streaming copies and hashing
CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    size: int
    #: hex SHA-256 when the store knows it (it wrote the object itself); None when only a client did
    sha256: str | None = None
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class ListedObject:
    """One object as a listing reports it (no content type or digest: S3 listings do not carry them)."""

    key: str
    size_bytes: int
    #: aware, UTC: when the object's current bytes were published
    modified_at: datetime


@dataclass(frozen=True, slots=True)
class UploadTarget:
    """What a client needs to upload one object directly, without our credentials."""

    #: "PUT" (fs: raw body) or "POST" (s3: multipart/form-data with `fields` first, then the file)
    method: str
    #: absolute URL, or a path starting with "/" that the API resolves against its own base URL (fs store)
    url: str
    fields: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CompletedPart:
    part_number: int
    etag: str


class StoreError(Exception):
    pass


class ObjectTooLarge(StoreError):
    """The stream went past `max_bytes`; nothing was stored."""


class ObjectNotFound(StoreError):
    pass


@runtime_checkable
class ObjectStore(Protocol):
    #: "fs" or "s3"
    kind: str
    #: recorded in `assets.bucket`
    bucket: str

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str, max_bytes: int) -> StoredObject: ...

    def head(self, key: str) -> StoredObject | None: ...

    def open_read(self, key: str) -> IO[bytes]:
        """A binary stream positioned at the start; the caller closes it. ObjectNotFound if missing."""
        ...

    def download_to(self, key: str, path: Path) -> int:
        """Copy the object to a local file; returns the number of bytes written."""
        ...

    def delete(self, key: str) -> None: ...

    def iter_objects(self, prefix: str = "", start_after: str | None = None) -> Iterator[ListedObject]:
        """Every object whose key starts with `prefix` (plain string prefix, S3 semantics), streamed in key order;
        with `start_after`, only the keys after it (S3's StartAfter), so a long listing can resume in pages."""
        ...

    def signed_get_url(self, key: str, ttl_s: int, filename: str | None = None, *, now: datetime | None = None) -> str:
        """A URL that downloads the object (as an attachment) until `now + ttl_s`."""
        ...

    def upload_target(
        self, key: str, size_bytes: int, content_type: str, ttl_s: int, *, upload_id: str, now: datetime | None = None
    ) -> UploadTarget:
        """Direct-upload instructions for exactly `size_bytes` bytes of `content_type` under `key`."""
        ...


@runtime_checkable
class LocallySignedStore(ObjectStore, Protocol):
    """A store whose signed URLs are served by the API itself (fs): the API verifies the signature."""

    def verify(
        self,
        method: str,
        resource: str,
        expires: int,
        sig: str,
        *,
        filename: str | None = None,
        now: datetime | None = None,
    ) -> bool: ...


@runtime_checkable
class MultipartStore(ObjectStore, Protocol):
    """Client-side multipart uploads (s3). Parts are uploaded with presigned PUT URLs, which cannot limit size,
    so `complete()` verification (HEAD size == declared, checksum) stays the real control."""

    def create_multipart(self, key: str, content_type: str) -> str: ...

    def presign_parts(self, key: str, upload_id: str, part_count: int, ttl_s: int) -> list[str]: ...

    def complete_multipart(self, key: str, upload_id: str, parts: list[CompletedPart]) -> StoredObject: ...

    def abort_multipart(self, key: str, upload_id: str) -> None: ...


class HashingCounter:
    """Running SHA-256 and byte count over a stream, with the size cap checked before each chunk lands."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._hash = hashlib.sha256()

    def feed(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if not chunk:
                continue
            self.size += len(chunk)
            if self.size > self.max_bytes:
                raise ObjectTooLarge(f"object exceeds {self.max_bytes} bytes")
            self._hash.update(chunk)
            yield chunk

    @property
    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def validate_prefix(prefix: str) -> str:
    """A listing prefix must be a key, or a key followed by "/", or empty: nothing a listing could use to leave the
    store's root."""
    if prefix:
        validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def readable_key(key: str) -> str:
    """`key` if a signed URL may name it: valid and not in quarantine, whose bytes are unvalidated."""
    validate_key(key)
    if is_quarantined(key):
        raise InvalidKey("a quarantined upload cannot be read through a URL")
    return key


def iter_file(stream: IO[bytes], chunk_size: int = CHUNK) -> Iterator[bytes]:
    while chunk := stream.read(chunk_size):
        yield chunk


def sha256_of(stream: IO[bytes]) -> tuple[str, int]:
    """(hex digest, size) of a stream, read in chunks."""
    digest, size = hashlib.sha256(), 0
    for chunk in iter_file(stream):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def content_disposition(filename: str | None) -> str:
    """Always `attachment` (originals are never rendered inline U10); the name is given as
    an ASCII fallback plus RFC 5987 UTF-8 form so no client-supplied byte can break the header."""
    if not filename:
        return "attachment"
    ascii_name = "".join(c if 32 <= ord(c) < 127 and c not in '"\\;' else "_" for c in filename)[:200]
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename[:200], safe='')}"
