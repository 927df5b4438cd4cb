"""API keys: only their SHA-256 is stored (services/tenants.py makes and checks them)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db.tables import api_keys, tenants
from aivedio_engine.domain.status import TenantStatus

_k = api_keys.c


@dataclass(frozen=True, slots=True)
class KeyOwner:
    """A tenant and one of its keys; `key_id` None: the tenant has no live key."""

    tenant_id: uuid.UUID
    key_id: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class LiveKey:
    tenant_id: uuid.UUID
    key_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class KeyState:
    revoked_at: datetime | None


def insert(
    conn: Connection,
    key_id: uuid.UUID,
    tenant_id: uuid.UUID,
    key_hash: bytes,
    prefix: str,
    name: str | None,
    now: datetime,
) -> None:
    conn.execute(
        api_keys.insert().values(
            id=key_id, tenant_id=tenant_id, key_hash=key_hash, prefix=prefix, name=name, created_at=now
        )
    )


def state(conn: Connection, key_id: uuid.UUID) -> KeyState | None:
    """Whether and when the key was revoked; None when there is no such key."""
    row = conn.execute(sa.select(_k.revoked_at).where(_k.id == key_id)).first()
    return None if row is None else KeyState(row.revoked_at)


def revoke(conn: Connection, key_id: uuid.UUID, now: datetime) -> None:
    conn.execute(api_keys.update().where(_k.id == key_id).values(revoked_at=now))


def named_tenant_key(conn: Connection, name: str) -> KeyOwner | None:
    """The tenant named `name` with a live key of its (any one), or None when there is no such tenant."""
    stmt = (
        sa.select(_k.id, tenants.c.id.label("tenant_id"))
        .join(api_keys, sa.and_(_k.tenant_id == tenants.c.id, _k.revoked_at.is_(None)), isouter=True)
        .where(tenants.c.name == name)
    )
    row = conn.execute(stmt).first()
    return None if row is None else KeyOwner(tenant_id=row.tenant_id, key_id=row.id)


def live_key(conn: Connection, key_hash: bytes) -> LiveKey | None:
    """The key with this hash, if it is live and its tenant active."""
    stmt = (
        sa.select(_k.id, _k.tenant_id)
        .join(tenants, tenants.c.id == _k.tenant_id)
        .where(_k.key_hash == key_hash, _k.revoked_at.is_(None), tenants.c.status == TenantStatus.ACTIVE.value)
    )
    row = conn.execute(stmt).first()
    return None if row is None else LiveKey(tenant_id=row.tenant_id, key_id=row.id)
