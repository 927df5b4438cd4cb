"""Tenant persistence: the limits an operator sets on a tenant, and the listing `aivedio tenants list` shows."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db import balances
from aivedio_engine.db.tables import api_keys, tenants

_t = tenants.c

#: the columns `set_limits` may change; NULL in any but priority_tier means "the config's default"
LIMIT_COLUMNS = (
    "rate_limit_per_s",
    "rate_limit_burst",
    "max_concurrency",
    "priority_tier",
    "max_upload_bytes",
    "retention_outputs_days",
    "retention_inputs_days",
    "retention_prompts_days",
)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's own limits as stored; None = the config's default applies."""

    tenant_id: uuid.UUID
    rate_limit_per_s: float | None
    rate_limit_burst: int | None
    max_concurrency: int | None
    priority_tier: int
    max_upload_bytes: int | None
    retention_outputs_days: int | None = None
    retention_inputs_days: int | None = None
    retention_prompts_days: int | None = None


@dataclass(frozen=True, slots=True)
class TenantSummary:
    id: uuid.UUID
    name: str
    status: str
    credit_balance: Decimal
    active_keys: int
    limits: TenantLimits


def _limits_of(r: sa.Row[Any], tenant_id: uuid.UUID) -> TenantLimits:
    return TenantLimits(
        tenant_id=tenant_id,
        rate_limit_per_s=None if r.rate_limit_per_s is None else float(r.rate_limit_per_s),
        rate_limit_burst=r.rate_limit_burst,
        max_concurrency=r.max_concurrency,
        priority_tier=int(r.priority_tier),
        max_upload_bytes=r.max_upload_bytes,
        retention_outputs_days=r.retention_outputs_days,
        retention_inputs_days=r.retention_inputs_days,
        retention_prompts_days=r.retention_prompts_days,
    )


_LIMIT_COLS = [getattr(_t, name) for name in LIMIT_COLUMNS]


def exists(conn: Connection, tenant_id: uuid.UUID) -> bool:
    return conn.execute(sa.select(_t.id).where(_t.id == tenant_id)).first() is not None


def name_taken(conn: Connection, name: str) -> bool:
    return conn.execute(sa.select(_t.id).where(_t.name == name)).first() is not None


def insert(
    conn: Connection,
    tenant_id: uuid.UUID,
    name: str,
    status: str,
    now: datetime,
    *,
    max_concurrency: int | None,
    max_upload_bytes: int | None,
) -> None:
    """A new tenant with a zero balance (its initial credits are a ledger entry)."""
    conn.execute(
        tenants.insert().values(
            id=tenant_id,
            name=name,
            status=status,
            max_concurrency=max_concurrency,
            max_upload_bytes=max_upload_bytes,
            created_at=now,
            updated_at=now,
        )
    )


def priority_tier(conn: Connection, tenant_id: uuid.UUID) -> int | None:
    """The tenant's priority tier; None when there is no such tenant."""
    tier: int | None = conn.execute(sa.select(_t.priority_tier).where(_t.id == tenant_id)).scalar()
    return tier


def limits(conn: Connection, tenant_id: uuid.UUID, *, lock: bool = False) -> TenantLimits | None:
    """The tenant's limits, or None when there is no such tenant. `lock` holds the row (PostgreSQL) until the
    caller's transaction ends, so a read-modify-write of the limits is not lost to a concurrent one."""
    stmt = sa.select(*_LIMIT_COLS).where(_t.id == tenant_id)
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(key_share=True)
    row = conn.execute(stmt).first()
    return None if row is None else _limits_of(row, tenant_id)


def set_limits(conn: Connection, tenant_id: uuid.UUID, changes: Mapping[str, float | int | None], now: datetime) -> int:
    """Write the given limit columns (a None clears one back to the default); returns the rows changed."""
    unknown = set(changes) - set(LIMIT_COLUMNS)
    if unknown:
        raise ValueError(f"not a tenant limit: {sorted(unknown)}")
    result = conn.execute(tenants.update().where(_t.id == tenant_id).values(**changes, updated_at=now))
    return int(result.rowcount)


def summaries(conn: Connection) -> list[TenantSummary]:
    """Every tenant, oldest first, with its live key count and limits."""
    live_keys = (
        sa.select(sa.func.count())
        .where(api_keys.c.tenant_id == _t.id, api_keys.c.revoked_at.is_(None))
        .scalar_subquery()
        .label("active_keys")
    )
    balance = balances.total_of(_t.id).label("credit_balance")
    stmt = sa.select(_t.id, _t.name, _t.status, balance, live_keys, *_LIMIT_COLS).order_by(_t.created_at)
    return [
        TenantSummary(
            id=r.id,
            name=r.name,
            status=r.status,
            credit_balance=r.credit_balance,
            active_keys=int(r.active_keys),
            limits=_limits_of(r, r.id),
        )
        for r in conn.execute(stmt)
    ]
