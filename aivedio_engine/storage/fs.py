"""Local-directory object store (embedded mode), with HMAC-signed URLs served by the API.

Layout under `root`: objects at `root/<key>`, a JSON sidecar per object at `root/.meta/<key>.json` (size,
sha256, content type, inode of the data file it describes) and in-flight writes in `root/.tmp/`. Keys cannot
start a segment with ".", so neither directory is reachable through a key.

Atomicity: data is written to `.tmp`, fsynced, then renamed over the key (same filesystem, so readers see the
old or the new file, never a prefix). The sidecar is renamed into place first and names the inode of the new
file; a crash between the two renames leaves a sidecar that does not match the file on disk, and `head()` then
reports sha256 as unknown instead of a wrong digest.

Listing (`iter_objects`) walks `root` and yields regular files only: anything under a name starting with "."
(`.tmp`, `.meta`, editor or OS litter) is outside the key space and never an object, and a symlink is never
followed (it could lead out of the root). `modified_at` is the data file's mtime, which `os.replace` carries over
from the finished temp file, so it is the time the object's bytes were published.

Signed URLs: `HMAC-SHA256(key, method \\n resource \\n expires \\n filename)`, URL-safe base64. `resource` is
`objects/<key>` for downloads and `uploads/<upload id>` for upload targets, so a download signature can never be
replayed as an upload and vice versa.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO
from urllib.parse import quote, urlencode

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.storage.base import (
    CHUNK,
    HashingCounter,
    ListedObject,
    ObjectNotFound,
    StoredObject,
    StoreError,
    UploadTarget,
    readable_key,
    validate_prefix,
)
from aivedio_engine.storage.keys import validate_key
from aivedio_engine.storage.signing import UrlSigner
from aivedio_engine.testing.failpoints import FailpointError, failpoint

SIGNING_KEY_FILE = "signing.key"
SIGNING_KEY_BYTES = 32
UPLOAD_PATH = "/v1/uploads/"
OBJECT_PATH = "/v1/objects/"


def load_signing_key(configured: str, data_dir: Path) -> bytes:
    """The configured key, else the one kept in `<data_dir>/signing.key`, created (0600) on first use.

    Creation is race-free across processes: the key is written to a private temp file and hard-linked into
    place, which fails if another process won; the loser then reads the winner's complete file."""
    if configured:
        return configured.encode()
    path = data_dir / SIGNING_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = data_dir / f".{SIGNING_KEY_FILE}.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(SIGNING_KEY_BYTES))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    key = path.read_bytes()
    if len(key) < SIGNING_KEY_BYTES:
        raise StoreError(f"{path} holds a signing key shorter than {SIGNING_KEY_BYTES} bytes")
    return key


class FsStore:
    kind = "fs"

    def __init__(
        self,
        root: Path,
        signing_key: bytes,
        *,
        bucket: str = "local",
        public_base_url: str = "",
        clock: Clock | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.bucket = bucket
        self._signer = UrlSigner(signing_key, clock)
        self._base = public_base_url.rstrip("/")
        self._clock = clock or SystemClock()
        (self.root / ".tmp").mkdir(parents=True, exist_ok=True)
        (self.root / ".meta").mkdir(parents=True, exist_ok=True)

    # --- paths -------------------------------------------------------------------------------------------

    def _data(self, key: str) -> Path:
        return self.root / validate_key(key)

    def local_path(self, key: str) -> Path | None:
        """The object's file, for a renderer on this machine; None when missing."""
        path = self._data(key)
        return path if path.is_file() else None

    def _meta(self, key: str) -> Path:
        return self.root / ".meta" / f"{validate_key(key)}.json"

    # --- objects -----------------------------------------------------------------------------------------

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str, max_bytes: int) -> StoredObject:
        data_path, meta_path = self._data(key), self._meta(key)
        # chaos runs arm these: a store answering with an error (as an S3 503 does) and a slow write
        failpoint("storage.put_slow")
        try:
            failpoint("storage.put")
        except FailpointError as exc:
            raise StoreError(f"cannot store {key}: {exc}") from exc
        tmp_dir = self.root / ".tmp"
        tmp = tmp_dir / uuid.uuid4().hex
        meta_tmp = tmp_dir / f"{tmp.name}.json"
        counter = HashingCounter(max_bytes)
        try:
            with open(tmp, "xb") as f:
                for chunk in counter.feed(chunks):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                ino = os.fstat(f.fileno()).st_ino
            meta = {"size": counter.size, "sha256": counter.hexdigest, "content_type": content_type, "ino": ino}
            meta_tmp.write_text(json.dumps(meta))
            data_path.parent.mkdir(parents=True, exist_ok=True)
            meta_path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(meta_tmp, meta_path)
            os.replace(tmp, data_path)
        except OSError as exc:
            raise StoreError(f"cannot store {key}: {exc.strerror or exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
            meta_tmp.unlink(missing_ok=True)
        return StoredObject(key, counter.size, counter.hexdigest, content_type)

    def head(self, key: str) -> StoredObject | None:
        try:
            st = self._data(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            meta = json.loads(self._meta(key).read_text())
        except (OSError, ValueError):
            meta = {}
        if meta.get("ino") == st.st_ino and meta.get("size") == st.st_size:
            return StoredObject(key, st.st_size, meta.get("sha256"), meta.get("content_type"))
        return StoredObject(key, st.st_size)

    def open_read(self, key: str) -> IO[bytes]:
        try:
            return open(self._data(key), "rb")  # the caller owns the stream
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def download_to(self, key: str, path: Path) -> int:
        with self.open_read(key) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
            return dst.tell()

    def delete(self, key: str) -> None:
        for path in (self._data(key), self._meta(key)):
            try:
                path.unlink(missing_ok=True)
            except IsADirectoryError:
                pass

    def iter_objects(self, prefix: str = "", start_after: str | None = None) -> Iterator[ListedObject]:
        validate_prefix(prefix)
        # walk only the deepest directory the prefix names in full; the rest of the prefix filters names
        start = self.root.joinpath(*prefix.split("/")[:-1])
        yield from self._walk(start, prefix, start_after or "")

    def _walk(self, directory: Path, prefix: str, after: str) -> Iterator[ListedObject]:
        try:
            # a directory sorts as "name/": every key under it starts so, which makes the walk S3's key order
            entries = sorted(os.scandir(directory), key=lambda e: e.name + "/" if e.is_dir() else e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            key = Path(entry.path).relative_to(self.root).as_posix()
            if entry.is_dir(follow_symlinks=False):
                inside = key + "/"
                wanted = inside.startswith(prefix) or prefix.startswith(inside)
                # skip a directory whose every key sorts at or before the resume point
                if wanted and (inside > after or after.startswith(inside)):
                    yield from self._walk(Path(entry.path), prefix, after)
            elif entry.is_file(follow_symlinks=False) and key.startswith(prefix) and key > after:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted since the directory was read
                    continue
                yield ListedObject(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    # --- signed URLs -------------------------------------------------------------------------------------

    def _now(self, now: datetime | None) -> datetime:
        return now or self._clock.now()

    def sign(self, method: str, resource: str, expires: int, filename: str | None = None) -> str:
        return self._signer.sign(method, resource, expires, filename)

    def verify(
        self,
        method: str,
        resource: str,
        expires: int,
        sig: str,
        *,
        filename: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        return self._signer.verify(method, resource, expires, sig, filename=filename, now=self._now(now))

    def signed_get_url(self, key: str, ttl_s: int, filename: str | None = None, *, now: datetime | None = None) -> str:
        readable_key(key)
        expires = int(self._now(now).timestamp()) + int(ttl_s)
        query = {"expires": str(expires), "sig": self.sign("GET", f"objects/{key}", expires, filename)}
        if filename:
            query["filename"] = filename
        return f"{self._base}{OBJECT_PATH}{quote(key)}?{urlencode(query)}"

    def upload_target(
        self, key: str, size_bytes: int, content_type: str, ttl_s: int, *, upload_id: str, now: datetime | None = None
    ) -> UploadTarget:
        validate_key(key)
        upload_id = str(uuid.UUID(str(upload_id)))
        expires = int(self._now(now).timestamp()) + int(ttl_s)
        sig = self.sign("PUT", f"uploads/{upload_id}", expires)
        return UploadTarget(
            method="PUT",
            url=f"{self._base}{UPLOAD_PATH}{upload_id}?{urlencode({'expires': expires, 'sig': sig})}",
            headers={"Content-Type": content_type},
            expires_at=datetime.fromtimestamp(expires, UTC),
        )
