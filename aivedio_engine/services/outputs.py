"""What a finished generation produced: its READY derivatives, as signed playback URLs or (embedded) local files.

Only derivatives are handed out, never the raw provider output: what clients play was transcoded by us
(U11: a polyglot upload or output is never served as-is).

HLS needs one more step: a playlist names its segments relatively, and a relative name resolved against a
signed object URL carries no signature. So the HLS link points at `/v1/playback/{asset}/index.m3u8` (signed by
us), which serves the stored playlist with every segment (and the init segment) replaced by its own signed URL.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
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


@dataclass(frozen=True, slots=True)
class TaskOutputs:
    """What one task produced: `files` are its output's READY derivatives (the first variant's), `variants`
    every output of its job with theirs."""

    files: dict[str, OutputFile]
    variants: list[Variant]


class OutputService:
    def __init__(self, engine: Engine, settings: Settings, store: ObjectStore, signer: UrlSigner) -> None:
        self._engine = engine
        self._settings = settings
        self._store = store
        self._signer = signer

    def of_tasks(self, tenant_id: uuid.UUID, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, TaskOutputs]:
        """What each of the tenant's `task_ids` produced, read in one statement however many there are (a page
        of a listing); a task without an output is absent."""
        if not task_ids:
            return {}
        with self._engine.connect() as conn:
            rows = output_rows.task_outputs(conn, tenant_id, task_ids, self._settings.media.pipeline_version)
        # rows come by task, then output index: each raw output once per READY derivative (or once, without)
        variants: dict[uuid.UUID, list[Variant]] = {}
        first: dict[uuid.UUID, Variant] = {}
        by_raw: dict[uuid.UUID, Variant] = {}
        for row in rows:
            variant = by_raw.get(row.raw.id)
            if variant is None:
                variant = by_raw[row.raw.id] = Variant(row.raw.output_index or 0, _file(row.raw, ORIGINAL), {})
                variants.setdefault(row.task_id, []).append(variant)
                if row.is_task_output:
                    first[row.task_id] = variant
            if row.derived is not None:
                variant.files[row.derived.profile] = _file(row.derived, row.derived.profile)
        return {
            task: TaskOutputs(first[task].files if task in first else {}, found) for task, found in variants.items()
        }

    def files(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, OutputFile]:
        """READY derivatives of the task's output under the current pipeline version, by profile."""
        found = self.of_tasks(tenant_id, [task_id]).get(task_id)
        return {} if found is None else found.files

    def original(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> OutputFile | None:
        """The raw provider output the derivatives were made from, for this machine's own user (embedded mode:
        `aivedio generations download`). Never handed out over the API: clients get transcoded derivatives only."""
        with self._engine.connect() as conn:
            r = output_rows.original(conn, tenant_id, task_id)
        return None if r is None else _file(r, ORIGINAL)

    def variants(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[Variant]:
        """Every output of the job the task's output came from, by index, each with its READY derivatives under
        the current pipeline version (a job of one output: one variant, the same files as `files()`)."""
        found = self.of_tasks(tenant_id, [task_id]).get(task_id)
        return [] if found is None else found.variants

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
        return {p: self.local_path(f) for p, f in self.files(tenant_id, task_id).items()}

    def local_path(self, file: OutputFile) -> Path:
        """Where `file` is on this machine (fs store only: embedded mode)."""
        root = getattr(self._store, "root", None)
        if self._store.kind != "fs" or root is None:
            raise ValueError("local paths exist only with the fs object store")
        return Path(root) / file.key


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


def _file(row: output_rows.OutputAsset, profile: str) -> OutputFile:
    sha256 = str(row.checksum_value) if row.checksum_algorithm == "sha256" and row.checksum_value else None
    return OutputFile(row.id, profile, row.object_key, row.size_bytes, row.width, row.height, sha256)
