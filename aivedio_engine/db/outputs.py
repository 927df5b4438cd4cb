"""A task's outputs: the RAW_OUTPUT assets a fetch records for a provider's job, and the read model clients are
handed (the READY derivatives of those outputs, the raw output itself, an HLS playlist's key)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
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


@dataclass(frozen=True, slots=True)
class TaskOutputRow:
    """One raw output of the job a task's output came from, with one of its READY derivatives (None: it has
    none), as `task_outputs` returns them."""

    task_id: uuid.UUID
    #: the raw output the task points at (`output_asset_id`): the first of its job
    is_task_output: bool
    raw: RawOutputAsset
    derived: DerivedAsset | None


def task_outputs(
    conn: Connection, tenant_id: uuid.UUID, task_ids: Sequence[uuid.UUID], pipeline_version: int
) -> list[TaskOutputRow]:
    """For each of `task_ids` (the tenant's), every raw output of the job its output came from, joined to their
    READY derivatives built by `pipeline_version`; by task, then output index. One statement for any number of
    tasks, so a page of a listing costs what one task does; tasks without an output have no rows."""
    if not task_ids:
        return []
    first, raw, der = assets.alias("first"), assets.alias("raw"), assets.alias("der")
    stmt = (
        sa.select(
            _t.id.label("task_id"),
            _t.output_asset_id,
            raw.c.id,
            raw.c.output_index,
            *(raw.c[c.name] for c in _FILE),
            der.c.id.label("d_id"),
            der.c.profile.label("d_profile"),
            *(der.c[c.name].label(f"d_{c.name}") for c in _FILE),
        )
        .select_from(generation_tasks)
        .join(first, first.c.id == _t.output_asset_id)
        .join(
            raw,
            (raw.c.task_id == first.c.task_id)
            & (raw.c.attempt_id == first.c.attempt_id)
            & (raw.c.kind == AssetKind.RAW_OUTPUT.value)
            & (raw.c.tenant_id == tenant_id),
        )
        .outerjoin(
            der,
            (der.c.parent_asset_id == raw.c.id)
            & (der.c.tenant_id == tenant_id)
            & (der.c.status == AssetStatus.READY.value)
            & (der.c.pipeline_version == pipeline_version),
        )
        .where(_t.id.in_(list(task_ids)), _t.tenant_id == tenant_id)
        .order_by(_t.id, raw.c.output_index, raw.c.id)
    )
    return [
        TaskOutputRow(
            r.task_id,
            r.id == r.output_asset_id,
            RawOutputAsset(
                r.id,
                r.object_key,
                r.size_bytes,
                r.width,
                r.height,
                r.checksum_algorithm,
                r.checksum_value,
                r.output_index,
            ),
            None
            if r.d_id is None
            else DerivedAsset(
                r.d_id,
                r.d_object_key,
                r.d_size_bytes,
                r.d_width,
                r.d_height,
                r.d_checksum_algorithm,
                r.d_checksum_value,
                r.d_profile,
            ),
        )
        for r in conn.execute(stmt)
    ]


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
