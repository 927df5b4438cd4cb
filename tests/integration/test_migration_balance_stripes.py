"""Migration 0027 on a database whose balances live in 0026's 16 stripes: nothing is lost, and the stripes a
tenant did not have yet (16–63) are made by its next spread or credit, not assumed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import balances, ledger, migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import credit_ledger, tenant_balance_stripes
from aivedio_engine.domain.status import LedgerEntryType
from tests.support.migrations import upgrade_to_before

pytestmark = pytest.mark.postgres
NOW = datetime(2026, 1, 1, tzinfo=UTC)
_s = tenant_balance_stripes.c


@pytest.fixture
def engine(pg_empty_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_empty_url}}))
    yield eng
    eng.dispose()


def _stripes(engine: sa.Engine, tenant: uuid.UUID) -> dict[int, Decimal]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(_s.stripe, _s.balance).where(_s.tenant_id == tenant)).all()
    return {r.stripe: r.balance for r in rows}


def _ledger_sum(engine: sa.Engine, tenant: uuid.UUID) -> Decimal:
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.sum(credit_ledger.c.amount)).where(credit_ledger.c.tenant_id == tenant))
        return Decimal(total.scalar_one())


def _key_on(stripe: int, prefix: str) -> str:
    return next(k for i in range(100_000) if balances.stripe_of(key=(k := f"{prefix}-{i}")) == stripe)


def test_0027_keeps_16_stripe_balances_and_grows_them_to_64(engine: sa.Engine, tmp_path: Path) -> None:
    upgrade_to_before(engine, "0027", tmp_path)
    tenant = uuid.uuid4()
    with engine.begin() as conn:  # a tenant as 0026 left it: 16 credits spread over its 16 stripes, and its ledger
        conn.execute(
            sa.text("INSERT INTO tenants (id, name, created_at, updated_at) VALUES (:id, 'old', :t, :t)"),
            {"id": tenant, "t": NOW},
        )
        conn.execute(
            sa.text("INSERT INTO tenant_balance_stripes (tenant_id, stripe, balance) VALUES (:id, :s, 1)"),
            [{"id": tenant, "s": s} for s in range(16)],
        )
        conn.execute(
            sa.text(
                "INSERT INTO credit_ledger (id, tenant_id, entry_type, amount, business_key, created_by, created_at)"
                " VALUES (:id, :tenant, 'ADJUSTMENT', 16, 'adjustment:grant', 'test', :t)"
            ),
            {"id": uuid.uuid4(), "tenant": tenant, "t": NOW},
        )

    assert "0027_wider_balance_stripes.sql" in migrate.upgrade(engine)
    assert _stripes(engine, tenant) == {s: Decimal(1) for s in range(16)}  # nothing moved

    # a debit whose stripe has no row yet takes the spreading path: all 64 rows, the sum less 3, spread evenly
    with write_tx(engine) as conn:
        ledger.post(
            conn,
            tenant_id=tenant,
            entry_type=LedgerEntryType.ADJUSTMENT,
            amount=Decimal(-3),
            business_key=_key_on(40, "adjustment:take"),
            now=NOW,
            created_by="test",
        )
    after = _stripes(engine, tenant)
    assert sorted(after) == list(range(balances.STRIPES)) == list(range(64))
    assert set(after.values()) == {Decimal("0.203125")}  # 13 / 64, exactly
    # a credit to a stripe is an upsert, and the CHECK now admits every stripe up to 63
    with write_tx(engine) as conn:
        balances.credit(conn, tenant, Decimal("0.5"), stripe=63)
        ledger_row = {"id": uuid.uuid4(), "tenant": tenant, "t": NOW}
        conn.execute(
            sa.text(
                "INSERT INTO credit_ledger (id, tenant_id, entry_type, amount, business_key, created_by, created_at)"
                " VALUES (:id, :tenant, 'ADJUSTMENT', 0.5, 'adjustment:direct', 'test', :t)"
            ),
            ledger_row,
        )
    assert _stripes(engine, tenant)[63] == Decimal("0.703125")
    with engine.connect() as conn:
        assert balances.total(conn, tenant) == Decimal("13.5") == _ledger_sum(engine, tenant)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.insert(tenant_balance_stripes).values(tenant_id=tenant, stripe=64, balance=0))
