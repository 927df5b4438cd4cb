"""Asset persistence used by the pipeline steps: the input assets a task's request names."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import assets

_a = assets.c


@dataclass(frozen=True, slots=True)
class InputAsset:
    id: uuid.UUID
    kind: str
    status: str
    object_key: str
    mime: str | None


def inputs_of(conn: Connection, tenant_id: uuid.UUID, asset_ids: Sequence[str]) -> list[InputAsset | None]:
    """The named assets of the tenant, in request order; None where an id no longer exists."""
    if not asset_ids:
        return []
    wanted = [uuid.UUID(a) for a in asset_ids]
    rows = {
        r.id: r
        for r in conn.execute(
            sa.select(_a.id, _a.kind, _a.status, _a.object_key, _a.mime_detected).where(
                _a.id.in_(wanted), _a.tenant_id == tenant_id
            )
        )
    }
    found: list[InputAsset | None] = []
    for asset_id in wanted:
        row = rows.get(asset_id)
        found.append(
            None if row is None else InputAsset(row.id, row.kind, row.status, row.object_key, row.mime_detected)
        )
    return found
