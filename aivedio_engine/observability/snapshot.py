"""The local disks the engine writes to, as the metrics and the storage-capacity alert rule see them (what the
database says is in `db/snapshot.py`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aivedio_engine.config import Settings


def local_paths(settings: Settings) -> list[Path]:
    """The local directories the engine writes: the data dir, and the object store root for `fs` storage."""
    paths = [Path(settings.data_dir)]
    if settings.storage.kind == "fs":
        paths.append(Path(settings.storage.root) if settings.storage.root else Path(settings.data_dir) / "objects")
    return paths


def storage_usage(settings: Settings) -> dict[str, Any]:
    """shutil.disk_usage per local path (the nearest existing parent of one not created yet), one per device."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for path in local_paths(settings):
        existing = path.absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        device = existing.stat().st_dev
        if device not in seen:
            seen.add(device)
            out[str(path)] = shutil.disk_usage(existing)
    return out
