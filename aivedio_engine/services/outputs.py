"""What a finished generation produced: its READY derivatives, as signed playback URLs or (embedded) local files.

Only derivatives are handed out, never the raw provider output: what clients play was transcoded by us
(reliability_anchors U11: a polyglot upload or output is never served as-is).

HLS needs one more step: a playlist names its segments relatively, and a relative name resolved against a
signed object URL carries no signature. So the HLS link points at `/v1/playback/{asset}/index.m3u8` (signed by
us), which serves the stored playlist with every segment (and the init segment) replaced by its own signed URL.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from aivedio_engine.config import Settings
from aivedio_engine.db import outputs as output_rows
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.status import DerivativeProfile
from aivedio_engine.services.errors import Forbidden, NotFound
from aivedio_engine.storage.base import ObjectStore
from aivedio_engine.storage.signing import UrlSigner

PLAYLIST_PATH = "/v1/playback/{asset_id}/index.m3u8"
#: a playlist is a few hundred lines; anything bigger is not one of ours
MAX_PLAYLIST_BYTES = 1024 * 1024
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_MAP_URI = re.compile(r'URI="([^"]*)"')
#: the name `original()` files the raw output under, beside the derivative profiles
ORIGINAL = "original"


@dataclass(frozen=True, slots=True)
class OutputFile:
    asset_id: uuid.UUID
    profile: str
    key: str
    size_bytes: int | None
    width: int | None
    height: int | None
    #: hex SHA-256 recorded on the asset row when the object was stored (None if none was recorded)
    sha256: str | None = None


@dataclass(frozen=True, slots=True)
class Variant:
    """One output of a job of `n` (index 0 is the one `files()` describes): the raw output and its derivatives."""

    index: int
    original: OutputFile
    files: dict[str, OutputFile]


class OutputService:
    def __init__(self, engine: Engine, settings: Settings, store: ObjectStore, signer: UrlSigner) -> None:
        self._engine = engine
        self._settings = settings
        self._store = store
        self._signer = signer

    def files(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, OutputFile]:
        """READY derivatives of the task's output under the current pipeline version, by profile."""
        with self._engine.connect() as conn:
            rows = output_rows.ready_derivatives(conn, tenant_id, task_id, self._settings.media.pipeline_version)
        return {
            r.profile: OutputFile(r.id, r.profile, r.object_key, r.size_bytes, r.width, r.height, _sha256(r))
            for r in rows
        }

    def original(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> OutputFile | None:
        """The raw provider output the derivatives were made from, for this machine's own user (embedded mode:
        `aivedio generations download`). Never handed out over the API: clients get transcoded derivatives only."""
        with self._engine.connect() as conn:
            r = output_rows.original(conn, tenant_id, task_id)
        return (
            None if r is None else OutputFile(r.id, ORIGINAL, r.object_key, r.size_bytes, r.width, r.height, _sha256(r))
        )

    def variants(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[Variant]:
        """Every output of the job the task's output came from, by index, each with its READY derivatives under
        the current pipeline version (a job of one output: one variant, the same files as `files()`)."""
        pv = self._settings.media.pipeline_version
        with self._engine.connect() as conn:
            rows = output_rows.job_raw_outputs(conn, tenant_id, task_id)
            derived = output_rows.ready_derivatives_of(conn, tenant_id, [r.id for r in rows], pv) if rows else []
        by_parent: dict[uuid.UUID, dict[str, OutputFile]] = {r.id: {} for r in rows}
        for parent, d in derived:
            by_parent[parent][d.profile] = OutputFile(
                d.id, d.profile, d.object_key, d.size_bytes, d.width, d.height, _sha256(d)
            )
        return [
            Variant(
                r.output_index or 0,
                OutputFile(r.id, ORIGINAL, r.object_key, r.size_bytes, r.width, r.height, _sha256(r)),
                by_parent[r.id],
            )
            for r in rows
        ]

    def urls(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, files: dict[str, OutputFile] | None = None
    ) -> dict[str, str]:
        """Signed, expiring playback URLs (`storage.playback_url_ttl_s`); paths starting with / are on our API.
        `files` is what `files()` returned, when the caller already read it."""
        ttl = self._settings.storage.playback_url_ttl_s
        urls = {}
        for profile, f in (self.files(tenant_id, task_id) if files is None else files).items():
            if profile == DerivativeProfile.HLS.value:
                expires = self._signer.expires_in(ttl)
                path = PLAYLIST_PATH.format(asset_id=f.asset_id)
                sig = self._signer.sign("GET", path, expires)
                urls[profile] = f"{path}?{urlencode({'expires': expires, 'sig': sig})}"
            else:
                urls[profile] = self._store.signed_get_url(f.key, ttl)
        return urls

    def signed_playlist(self, asset_id: str, expires: int, sig: str) -> str:
        """The stored HLS playlist with each segment URI replaced by a signed URL living as long as the link."""
        try:
            asset_uuid = uuid.UUID(asset_id)
        except ValueError:
            raise Forbidden("invalid playback signature") from None
        path = PLAYLIST_PATH.format(asset_id=asset_uuid)
        if not self._signer.verify("GET", path, expires, sig):
            raise Forbidden("invalid or expired playback signature")
        with self._engine.connect() as conn:
            key = output_rows.hls_playlist_key(conn, asset_uuid)
        if key is None:
            raise NotFound("playlist not found")
        with self._store.open_read(key) as f:
            text = f.read(MAX_PLAYLIST_BYTES + 1)
        if len(text) > MAX_PLAYLIST_BYTES:
            raise NotFound("playlist not found")
        ttl = max(1, expires - self._signer.expires_in(0))
        folder = key.rsplit("/", 1)[0] + "/"

        def signed(name: str) -> str:
            if not safe_segment_name(name):  # our playlists name files in their own folder, nothing else
                raise NotFound("playlist not found")
            return self._store.signed_get_url(folder + name, ttl)

        return rewrite_playlist(text.decode("utf-8"), signed)

    def local_paths(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, Path]:
        """Files on this machine (fs store only: embedded mode)."""
        root = getattr(self._store, "root", None)
        if self._store.kind != "fs" or root is None:
            raise ValueError("local paths exist only with the fs object store")
        return {p: Path(root) / f.key for p, f in self.files(tenant_id, task_id).items()}


def rewrite_playlist(text: str, uri: Callable[[str], str]) -> str:
    """`text` with every file it names (the init segment in `#EXT-X-MAP`, each media segment) replaced by
    `uri(name)`. Serving signs the names; a client downloading a playlist maps the signed URLs back to names
    (which gives back the stored playlist, byte for byte, when it was written in this normal form)."""
    lines = []
    for line in text.splitlines():
        if line.startswith("#EXT-X-MAP:"):
            line = _MAP_URI.sub(lambda m: f'URI="{uri(m.group(1))}"', line)
        elif line and not line.startswith("#"):
            line = uri(line.strip())
        lines.append(line)
    return "\n".join(lines) + "\n"


def safe_segment_name(name: str) -> bool:
    """A file name a playlist of ours may use: a plain name in the playlist's own folder."""
    return bool(_SAFE_NAME.fullmatch(name))


def _sha256(row: output_rows.OutputAsset) -> str | None:
    return str(row.checksum_value) if row.checksum_algorithm == "sha256" and row.checksum_value else None
