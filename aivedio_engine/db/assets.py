"""Asset persistence used by the pipeline steps: the input assets a task's request names, the asset row a media
run works on, and the rows it records (probe facts, derivatives)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets
from aivedio_engine.domain.status import AssetKind, AssetStatus

_a = assets.c


@dataclass(frozen=True, slots=True)
class InputAsset:
    id: uuid.UUID
    kind: str
    status: str
    object_key: str
    mime: str | None
    #: what upload validation measured (None where it did not): the model's reference limits are checked on them
    size_bytes: int | None = None
    width: int | None = None
    height: int | None = None


def inputs_of(conn: Connection, tenant_id: uuid.UUID, asset_ids: Sequence[str]) -> list[InputAsset | None]:
    """The named assets of the tenant, in request order; None where an id no longer exists."""
    if not asset_ids:
        return []
    wanted = [uuid.UUID(a) for a in asset_ids]
    rows = {
        r.id: r
        for r in conn.execute(
            sa.select(
                _a.id, _a.kind, _a.status, _a.object_key, _a.mime_detected, _a.size_bytes, _a.width, _a.height
            ).where(_a.id.in_(wanted), _a.tenant_id == tenant_id)
        )
    }
    found: list[InputAsset | None] = []
    for asset_id in wanted:
        row = rows.get(asset_id)
        found.append(
            None
            if row is None
            else InputAsset(
                row.id, row.kind, row.status, row.object_key, row.mime_detected, row.size_bytes, row.width, row.height
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class RawOutput:
    """One output a provider delivered for a task (a RAW_OUTPUT asset), with its READY derivatives' profiles."""

    id: uuid.UUID
    index: int
    ready_profiles: frozenset[str]


def raw_outputs(conn: Connection, raw_asset_id: uuid.UUID, pipeline_version: int) -> list[RawOutput]:
    """Every raw output delivered with `raw_asset_id` (same task and attempt: the outputs of one job), by index,
    each with the profiles of its READY derivatives built by `pipeline_version`."""
    job = sa.select(_a.task_id, _a.attempt_id).where(_a.id == raw_asset_id).subquery()
    raws = conn.execute(
        sa.select(_a.id, _a.output_index)
        .where(
            _a.task_id == job.c.task_id,
            _a.attempt_id == job.c.attempt_id,
            _a.kind == AssetKind.RAW_OUTPUT.value,
        )
        .order_by(_a.output_index, _a.created_at)
    ).all()
    ready: dict[uuid.UUID, set[str]] = {r.id: set() for r in raws}
    if raws:
        for row in conn.execute(
            sa.select(_a.parent_asset_id, _a.profile).where(
                _a.parent_asset_id.in_(list(ready)),
                _a.status == AssetStatus.READY.value,
                _a.pipeline_version == pipeline_version,
            )
        ):
            ready[row.parent_asset_id].add(row.profile)
    return [RawOutput(r.id, r.output_index or 0, frozenset(ready[r.id])) for r in raws]


@dataclass(frozen=True, slots=True)
class Asset:
    """One `assets` row, every column."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    kind: str
    parent_asset_id: uuid.UUID | None
    task_id: uuid.UUID | None
    attempt_id: uuid.UUID | None
    output_index: int | None
    profile: str | None
    pipeline_version: int | None
    status: str
    bucket: str
    object_key: str
    size_bytes: int | None
    checksum_algorithm: str | None
    checksum_value: str | None
    mime_detected: str | None
    duration_ms: int | None
    width: int | None
    height: int | None
    frame_rate_num: int | None
    frame_rate_den: int | None
    probe: Any
    error: str | None
    created_at: datetime
    ready_at: datetime | None


def read(conn: Connection, asset_id: uuid.UUID) -> Asset | None:
    row = conn.execute(sa.select(assets).where(_a.id == asset_id)).first()
    return None if row is None else Asset(**row._mapping)


def set_columns(conn: Connection, asset_id: uuid.UUID, values: Mapping[str, Any]) -> None:
    """Set the named columns of one asset."""
    conn.execute(assets.update().where(_a.id == asset_id).values(**values))


def save_derivative(
    conn: Connection,
    *,
    parent_id: uuid.UUID,
    task_id: uuid.UUID,
    tenant_id: uuid.UUID,
    kind: str,
    profile: str,
    pipeline_version: int,
    bucket: str,
    now: datetime,
    values: Mapping[str, Any],
) -> None:
    """Record a derivative of `parent_id` built by `pipeline_version`: its row updated when one exists (a rerun),
    inserted otherwise. `values`: the columns a run decides (status, object key, size, checksum, error, ready_at)."""
    existing = conn.execute(
        sa.select(_a.id).where(
            _a.parent_asset_id == parent_id, _a.profile == profile, _a.pipeline_version == pipeline_version
        )
    ).scalar()
    if existing is not None:
        conn.execute(assets.update().where(_a.id == existing).values(**values))
        return
    conn.execute(
        assets.insert().values(
            id=new_id(),
            tenant_id=tenant_id,
            kind=kind,
            parent_asset_id=parent_id,
            task_id=task_id,
            profile=profile,
            pipeline_version=pipeline_version,
            bucket=bucket,
            created_at=now,
            **values,
        )
    )
