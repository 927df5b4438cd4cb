"""A task's reference assets as the provider reads them (issue 10 item 1).

Vendors get a short-lived signed URL per reference (S3 presigned GET or the API's signed fs URL); the `local`
provider, which renders on this machine, gets a `file://` path. URLs are built at submit time, never stored in
the task, an event or a log line: they are bearer credentials for the tenant's upload. A reference that is no
longer READY, or whose object vanished from the store, fails the submit with `reference_unavailable` before the
provider is called, so nothing is billed for a request that cannot be what the client asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from aivedio_engine.db.assets import InputAsset
from aivedio_engine.domain.status import AssetKind, AssetStatus
from aivedio_engine.storage.base import ObjectStore


class ReferenceUnavailable(Exception):
    """A reference named by the task cannot be handed to the provider."""


@dataclass(frozen=True, slots=True)
class References:
    images: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()


class ReferenceResolver:
    def __init__(self, store: ObjectStore, ttl_s: int, cache_dir: Path) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._cache = cache_dir

    def resolve(
        self, found: Sequence[InputAsset | None], asset_ids: Sequence[str], *, transport: str, now: datetime
    ) -> References:
        images: list[str] = []
        videos: list[str] = []
        for asset_id, asset in zip(asset_ids, found, strict=True):
            if asset is None:
                raise ReferenceUnavailable(f"reference {asset_id} no longer exists")
            if asset.status != AssetStatus.READY.value:
                raise ReferenceUnavailable(f"reference {asset_id} is {asset.status}, not READY")
            if self._store.head(asset.object_key) is None:
                raise ReferenceUnavailable(f"reference {asset_id} is missing from the object store")
            url = (
                self._file_url(asset)
                if transport == "file"
                else self._store.signed_get_url(asset.object_key, self._ttl_s, now=now)
            )
            (videos if asset.kind == AssetKind.INPUT_VIDEO.value else images).append(url)
        return References(tuple(images), tuple(videos))

    def _file_url(self, asset: InputAsset) -> str:
        local = getattr(self._store, "local_path", None)
        path = local(asset.object_key) if local is not None else None
        if path is None:  # a remote store: the renderer reads a copy kept beside the data dir
            path = self._cache / asset.id.hex
            if not path.is_file():
                self._cache.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".part")
                self._store.download_to(asset.object_key, partial)
                partial.replace(path)
        return path.resolve().as_uri()
