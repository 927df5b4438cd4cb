"""What the orphan scan and the storage GC ask of the database: which object keys live asset rows reference, and
the `storage_scans` rows that record each scan's outcome."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import assets, storage_scans
from aivedio_engine.domain.status import AssetStatus

_a = assets.c
#: a deleted asset's leftover bytes are garbage
_LIVE = _a.status != AssetStatus.DELETED.value


def live_keys(conn: Connection, bucket: str, keys: Sequence[str]) -> set[str]:
    """Which of `keys` a live (not DELETED) asset of `bucket` names."""
    # bucket first: the unique (bucket, object_key) index answers the lookup
    return set(
        conn.execute(sa.select(_a.object_key).where(_a.bucket == bucket, _a.object_key.in_(keys), _LIVE)).scalars()
    )


def live_derivatives(conn: Connection, bucket: str, parents: Collection[uuid.UUID]) -> set[tuple[uuid.UUID, str, int]]:
    """(parent asset, profile, pipeline version) of every live derivative in `bucket` of one of `parents`."""
    return {
        (row[0], row[1], int(row[2]))
        for row in conn.execute(
            sa.select(_a.parent_asset_id, _a.profile, _a.pipeline_version).where(
                _a.bucket == bucket, _a.parent_asset_id.in_(parents), _LIVE
            )
        )
    }


def record_scan(
    conn: Connection,
    *,
    scan_id: uuid.UUID,
    started_at: datetime,
    finished_at: datetime,
    objects: int,
    bytes_: int,
    orphans: int,
    orphan_bytes: int,
    sample: list[str] | None,
    error: str | None,
) -> None:
    conn.execute(
        storage_scans.insert().values(
            id=scan_id,
            started_at=started_at,
            finished_at=finished_at,
            objects=objects,
            bytes=bytes_,
            orphans=orphans,
            orphan_bytes=orphan_bytes,
            sample=sample,
            error=error,
        )
    )


def latest_finished_at(conn: Connection) -> datetime | None:
    last: datetime | None = conn.execute(sa.select(sa.func.max(storage_scans.c.finished_at))).scalar()
    return last
