"""Reading and (for audit tests) corrupting a tenant's balance, which lives in striped rows (db/balances.py)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from aivedio_engine.db import balances
from aivedio_engine.db.tables import tenant_balance_stripes

_s = tenant_balance_stripes.c


def balance_of(conn: Connection, tenant_id: uuid.UUID) -> Decimal:
    return balances.total(conn, tenant_id)


def nudge_balance(tenant_id: uuid.UUID, amount: Decimal | int) -> Any:
    """An UPDATE that moves the balance by `amount` behind the ledger's back (the tenant's lowest stripe): what
    the audit's I4.6 must catch. The tenant must hold a stripe already (any credit made one)."""
    lowest = sa.select(sa.func.min(_s.stripe)).where(_s.tenant_id == tenant_id).scalar_subquery()
    return (
        tenant_balance_stripes.update()
        .where(_s.tenant_id == tenant_id, _s.stripe == lowest)
        .values(balance=_s.balance + amount)
    )
