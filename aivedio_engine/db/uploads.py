"""Input assets and their upload sessions: creating them, the per-tenant rate window, the validation claim and its
compare-and-set, abandoned sessions (services/assets.py holds the decisions)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.assets import Asset
from aivedio_engine.db.tables import assets, tenants, upload_sessions
from aivedio_engine.domain.status import AssetStatus, UploadSessionStatus

_a = assets.c
_s = upload_sessions.c


@dataclass(frozen=True, slots=True)
class UploadedAsset(Asset):
    """An asset with the content type its newest upload session declared (None: it has no session)."""

    declared_content_type: str | None


@dataclass(frozen=True, slots=True)
class UploadSession:
    """One `upload_sessions` row, every column."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    asset_id: uuid.UUID
    status: str
    object_key: str
    declared_size_bytes: int
    declared_content_type: str
    declared_sha256: str | None
    multipart_upload_id: str | None
    expires_at: datetime
    created_at: datetime
    completed_at: datetime | None
    quarantine_cleared_at: datetime | None


def _session(row: sa.Row[Any] | None) -> UploadSession | None:
    return None if row is None else UploadSession(**row._mapping)


def upload_cap(conn: Connection, tenant_id: uuid.UUID) -> int | None:
    """The tenant's plan cap on an upload's size (None: the platform's applies)."""
    cap: int | None = conn.execute(sa.select(tenants.c.max_upload_bytes).where(tenants.c.id == tenant_id)).scalar()
    return cap


def rate_window(
    conn: Connection, tenant_id: uuid.UUID, *, since: datetime, kinds: Collection[str], limit: int
) -> datetime | None:
    """Lock the tenant row (key share: serialises one tenant's creates on PostgreSQL), then the creation time of
    the `limit`-th newest asset of `kinds` the tenant created after `since` (None: fewer than `limit`)."""
    conn.execute(sa.select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True))
    oldest_counted: datetime | None = conn.execute(
        sa.select(_a.created_at)
        .where(_a.tenant_id == tenant_id, _a.created_at > since, _a.kind.in_(list(kinds)))
        .order_by(_a.created_at.desc())
        .offset(limit - 1)
        .limit(1)
    ).scalar()
    return oldest_counted


def create(
    conn: Connection,
    *,
    asset_id: uuid.UUID,
    session_id: uuid.UUID,
    tenant_id: uuid.UUID,
    kind: str,
    bucket: str,
    key: str,
    size_bytes: int,
    content_type: str,
    sha256: str | None,
    probe: Mapping[str, Any],
    expires_at: datetime,
    now: datetime,
) -> None:
    """An UPLOADING asset and its OPEN upload session, both naming the staging key."""
    conn.execute(
        assets.insert().values(
            id=asset_id,
            tenant_id=tenant_id,
            kind=kind,
            status=AssetStatus.UPLOADING.value,
            bucket=bucket,
            object_key=key,
            size_bytes=size_bytes,
            probe=probe,
            created_at=now,
        )
    )
    conn.execute(
        upload_sessions.insert().values(
            id=session_id,
            tenant_id=tenant_id,
            asset_id=asset_id,
            status=UploadSessionStatus.OPEN.value,
            object_key=key,
            declared_size_bytes=size_bytes,
            declared_content_type=content_type,
            declared_sha256=sha256,
            expires_at=expires_at,
            created_at=now,
        )
    )


def set_multipart_id(conn: Connection, session_id: uuid.UUID, upload_id: str) -> None:
    conn.execute(upload_sessions.update().where(_s.id == session_id).values(multipart_upload_id=upload_id))


def asset_of(conn: Connection, tenant_id: uuid.UUID, asset_id: uuid.UUID) -> UploadedAsset | None:
    """The tenant's asset (None for another tenant's), with its newest session's declared content type."""
    declared = (
        sa.select(_s.declared_content_type)
        .where(_s.asset_id == _a.id)
        .order_by(_s.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    row = conn.execute(
        sa.select(assets, declared.label("declared_content_type")).where(_a.id == asset_id, _a.tenant_id == tenant_id)
    ).first()
    return None if row is None else UploadedAsset(**row._mapping)


def latest_session(conn: Connection, asset_id: uuid.UUID) -> UploadSession | None:
    return _session(
        conn.execute(
            sa.select(upload_sessions).where(_s.asset_id == asset_id).order_by(_s.created_at.desc()).limit(1)
        ).first()
    )


def session(conn: Connection, session_id: uuid.UUID) -> UploadSession | None:
    return _session(conn.execute(sa.select(upload_sessions).where(_s.id == session_id)).first())


def claim(conn: Connection, asset_id: uuid.UUID, status: str, probe: Mapping[str, Any]) -> bool:
    """`status` → VALIDATING with the claim in `probe`; False when the asset is no longer in `status`."""
    return _move(conn, asset_id, status, AssetStatus.VALIDATING.value, probe)


def unclaim(conn: Connection, asset_id: uuid.UUID, probe: Mapping[str, Any]) -> None:
    """VALIDATING → UPLOADING, the claim taken out of `probe`."""
    _move(conn, asset_id, AssetStatus.VALIDATING.value, AssetStatus.UPLOADING.value, probe)


def _move(conn: Connection, asset_id: uuid.UUID, status: str, to: str, probe: Mapping[str, Any]) -> bool:
    result = conn.execute(assets.update().where(_a.id == asset_id, _a.status == status).values(status=to, probe=probe))
    return result.rowcount == 1


def finish_validation(
    conn: Connection,
    *,
    asset_id: uuid.UUID,
    tenant_id: uuid.UUID,
    session_id: uuid.UUID,
    values: Mapping[str, Any],
    now: datetime,
) -> bool:
    """The compare-and-set on a VALIDATING asset: its outcome `values` written and its session COMPLETED; False
    (nothing written) when the claim was lost."""
    won = (
        conn.execute(
            assets.update()
            .where(_a.id == asset_id, _a.tenant_id == tenant_id, _a.status == AssetStatus.VALIDATING.value)
            .values(**values)
        ).rowcount
        == 1
    )
    if won:
        conn.execute(
            upload_sessions.update()
            .where(_s.id == session_id, _s.status == UploadSessionStatus.OPEN.value)
            .values(status=UploadSessionStatus.COMPLETED.value, completed_at=now)
        )
    return won


def abandoned(conn: Connection, expired_before: datetime, batch: int) -> list[UploadSession]:
    """OPEN sessions of UPLOADING assets whose upload URL expired before `expired_before`, oldest first."""
    rows = conn.execute(
        sa.select(upload_sessions)
        .join(assets, _a.id == _s.asset_id)
        .where(
            _s.status == UploadSessionStatus.OPEN.value,
            _s.expires_at < expired_before,
            _a.status == AssetStatus.UPLOADING.value,
        )
        .order_by(_s.expires_at)
        .limit(batch)
    ).all()
    return [UploadSession(**r._mapping) for r in rows]


def expire_abandoned(conn: Connection, session: UploadSession, error: str) -> bool:
    """The asset UPLOADING → REJECTED with `error` and the session EXPIRED; False (nothing written) when the asset
    is no longer UPLOADING (a concurrent `complete()` claimed it)."""
    if (
        conn.execute(
            assets.update()
            .where(_a.id == session.asset_id, _a.status == AssetStatus.UPLOADING.value)
            .values(status=AssetStatus.REJECTED.value, error=error)
        ).rowcount
        != 1
    ):
        return False
    conn.execute(upload_sessions.update().where(_s.id == session.id).values(status=UploadSessionStatus.EXPIRED.value))
    return True
