"""A task's outputs: the RAW_OUTPUT assets a fetch records for a provider's job, and the read model clients are
handed (the READY derivatives of those outputs, the raw output itself, an HLS playlist's key)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import assets, generation_tasks, task_state_events
from aivedio_engine.domain.status import AssetKind, AssetStatus, DerivativeProfile, TaskStatus

_a = assets.c
_t = generation_tasks.c


@dataclass(frozen=True, slots=True)
class RawAsset:
    """A RAW_OUTPUT asset of one job, as the fetch recorded it."""

    output_index: int
    object_key: str
    size_bytes: int | None
    checksum_value: str | None


def raw_assets(conn: Connection, task_id: uuid.UUID, attempt_id: uuid.UUID) -> list[RawAsset]:
    """The raw outputs already recorded for the task's attempt."""
    rows = conn.execute(
        sa.select(_a.output_index, _a.object_key, _a.size_bytes, _a.checksum_value).where(
            _a.task_id == task_id, _a.attempt_id == attempt_id, _a.kind == AssetKind.RAW_OUTPUT.value
        )
    ).all()
    return [RawAsset(r.output_index, r.object_key, r.size_bytes, r.checksum_value) for r in rows]


def persisted_payload(conn: Connection, task_id: uuid.UUID) -> dict[str, Any]:
    """The payload the fetch's OUTPUT_FETCHING → POST_PROCESSING state event recorded ({} when none)."""
    e = task_state_events.c
    payload = conn.execute(
        sa.select(e.payload)
        .where(
            e.task_id == task_id,
            e.from_status == TaskStatus.OUTPUT_FETCHING.value,
            e.to_status == TaskStatus.POST_PROCESSING.value,
        )
        .order_by(e.task_version.desc())
        .limit(1)
    ).scalar()
    return dict(payload or {})


def raw_asset_id(conn: Connection, task_id: uuid.UUID, attempt_id: uuid.UUID, index: int) -> uuid.UUID:
    found: uuid.UUID = conn.execute(
        sa.select(_a.id).where(
            _a.task_id == task_id,
            _a.attempt_id == attempt_id,
            _a.output_index == index,
            _a.kind == AssetKind.RAW_OUTPUT.value,
        )
    ).scalar_one()
    return found


def insert_raw_output(
    conn: Connection,
    *,
    asset_id: uuid.UUID,
    tenant_id: uuid.UUID,
    task_id: uuid.UUID,
    attempt_id: uuid.UUID,
    index: int,
    bucket: str,
    key: str,
    size: int,
    sha256: str,
    mime: str,
    now: datetime,
) -> None:
    """A fetched output, PROCESSING until the media step has made it playable."""
    conn.execute(
        assets.insert().values(
            id=asset_id,
            tenant_id=tenant_id,
            kind=AssetKind.RAW_OUTPUT.value,
            task_id=task_id,
            attempt_id=attempt_id,
            output_index=index,
            status=AssetStatus.PROCESSING.value,
            bucket=bucket,
            object_key=key,
            size_bytes=size,
            checksum_algorithm="sha256",
            checksum_value=sha256,
            mime_detected=mime,
            created_at=now,
        )
    )


# --- the read model: what a finished generation produced ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputAsset:
    """An output file's asset row."""

    id: uuid.UUID
    object_key: str
    size_bytes: int | None
    width: int | None
    height: int | None
    checksum_algorithm: str | None
    checksum_value: str | None


@dataclass(frozen=True, slots=True)
class DerivedAsset(OutputAsset):
    profile: str


@dataclass(frozen=True, slots=True)
class RawOutputAsset(OutputAsset):
    output_index: int | None


#: what an output file's record holds after its id (`_file`), in select order
_FILE = (_a.object_key, _a.size_bytes, _a.width, _a.height, _a.checksum_algorithm, _a.checksum_value)


def _derived(r: Any) -> DerivedAsset:
    return DerivedAsset(
        r.id, r.object_key, r.size_bytes, r.width, r.height, r.checksum_algorithm, r.checksum_value, r.profile
    )


def ready_derivatives(
    conn: Connection, tenant_id: uuid.UUID, task_id: uuid.UUID, pipeline_version: int
) -> list[DerivedAsset]:
    """The READY derivatives of the task's output built by `pipeline_version`."""
    stmt = (
        sa.select(_a.id, _a.profile, *_FILE)
        .join(generation_tasks, _t.output_asset_id == _a.parent_asset_id)
        .where(
            _t.id == task_id,
            _t.tenant_id == tenant_id,
            _a.tenant_id == tenant_id,
            _a.status == AssetStatus.READY.value,
            _a.pipeline_version == pipeline_version,
        )
    )
    return [_derived(r) for r in conn.execute(stmt)]


def original(conn: Connection, tenant_id: uuid.UUID, task_id: uuid.UUID) -> OutputAsset | None:
    """The task's output asset (the raw output its derivatives were made from)."""
    stmt = (
        sa.select(_a.id, *_FILE)
        .join(generation_tasks, _t.output_asset_id == _a.id)
        .where(_t.id == task_id, _t.tenant_id == tenant_id, _a.tenant_id == tenant_id)
    )
    r = conn.execute(stmt).first()
    return (
        None
        if r is None
        else OutputAsset(r.id, r.object_key, r.size_bytes, r.width, r.height, r.checksum_algorithm, r.checksum_value)
    )


def job_raw_outputs(conn: Connection, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[RawOutputAsset]:
    """Every raw output of the job the task's output came from, by index."""
    raw, first = assets.alias("raw"), assets.alias("first")
    stmt = (
        sa.select(
            raw.c.id,
            raw.c.output_index,
            raw.c.object_key,
            raw.c.size_bytes,
            raw.c.width,
            raw.c.height,
            raw.c.checksum_algorithm,
            raw.c.checksum_value,
        )
        .join(first, (first.c.task_id == raw.c.task_id) & (first.c.attempt_id == raw.c.attempt_id))
        .join(generation_tasks, _t.output_asset_id == first.c.id)
        .where(
            _t.id == task_id,
            _t.tenant_id == tenant_id,
            raw.c.tenant_id == tenant_id,
            raw.c.kind == AssetKind.RAW_OUTPUT.value,
        )
        .order_by(raw.c.output_index)
    )
    return [
        RawOutputAsset(
            r.id, r.object_key, r.size_bytes, r.width, r.height, r.checksum_algorithm, r.checksum_value, r.output_index
        )
        for r in conn.execute(stmt)
    ]


def ready_derivatives_of(
    conn: Connection, tenant_id: uuid.UUID, parents: list[uuid.UUID], pipeline_version: int
) -> list[tuple[uuid.UUID, DerivedAsset]]:
    """The READY derivatives of `parents` built by `pipeline_version`, each with its parent."""
    rows = conn.execute(
        sa.select(_a.id, _a.parent_asset_id, _a.profile, *_FILE).where(
            _a.parent_asset_id.in_(parents),
            _a.tenant_id == tenant_id,
            _a.status == AssetStatus.READY.value,
            _a.pipeline_version == pipeline_version,
        )
    )
    return [(r.parent_asset_id, _derived(r)) for r in rows]


def hls_playlist_key(conn: Connection, asset_id: uuid.UUID) -> str | None:
    """The object key of a READY HLS derivative's playlist."""
    key: str | None = conn.execute(
        sa.select(_a.object_key).where(
            _a.id == asset_id,
            _a.profile == DerivativeProfile.HLS.value,
            _a.status == AssetStatus.READY.value,
        )
    ).scalar()
    return key
