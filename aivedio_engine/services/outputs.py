"""What a finished generation produced: its READY derivatives, as signed playback URLs or (embedded) local files.

Only derivatives are handed out, never the raw provider output: what clients play was transcoded by us
(reliability_anchors U11: a polyglot upload or output is never served as-is).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.config import Settings
from aivedio_engine.db.tables import assets, generation_tasks
from aivedio_engine.domain.status import AssetStatus
from aivedio_engine.storage.base import ObjectStore


@dataclass(frozen=True, slots=True)
class OutputFile:
    profile: str
    key: str
    size_bytes: int | None
    width: int | None
    height: int | None


class OutputService:
    def __init__(self, engine: Engine, settings: Settings, store: ObjectStore) -> None:
        self._engine = engine
        self._settings = settings
        self._store = store

    def files(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, OutputFile]:
        """READY derivatives of the task's output under the current pipeline version, by profile."""
        a, t = assets.c, generation_tasks.c
        stmt = (sa.select(a.profile, a.object_key, a.size_bytes, a.width, a.height)
                .join(generation_tasks, t.output_asset_id == a.parent_asset_id)
                .where(t.id == task_id, t.tenant_id == tenant_id, a.tenant_id == tenant_id,
                       a.status == AssetStatus.READY.value,
                       a.pipeline_version == self._settings.media.pipeline_version))
        with self._engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return {r.profile: OutputFile(r.profile, r.object_key, r.size_bytes, r.width, r.height) for r in rows}

    def urls(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, str]:
        """Signed, expiring playback URLs (`storage.playback_url_ttl_s`)."""
        ttl = self._settings.storage.playback_url_ttl_s
        return {p: self._store.signed_get_url(f.key, ttl) for p, f in self.files(tenant_id, task_id).items()}

    def local_paths(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> dict[str, Path]:
        """Files on this machine (fs store only: embedded mode)."""
        root = getattr(self._store, "root", None)
        if self._store.kind != "fs" or root is None:
            raise ValueError("local paths exist only with the fs object store")
        return {p: Path(root) / f.key for p, f in self.files(tenant_id, task_id).items()}
