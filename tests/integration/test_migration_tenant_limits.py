"""Migration 0012 on a database that already has tenants: tier 0 (the old default) becomes 2 (paid), the
column's comment now says tier 1 is served first, and only the seed's tiers and positive bursts are accepted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from tests.support.migrations import upgrade_to_before

pytestmark = pytest.mark.postgres
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def engine(pg_empty_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_empty_url}}))
    yield eng
    eng.dispose()


def test_0012_keeps_existing_tenants_in_the_tier_they_were_served_in(engine: sa.Engine, tmp_path: Path) -> None:
    upgrade_to_before(engine, "0012", tmp_path)
    old, vip = uuid.uuid4(), uuid.uuid4()
    insert = sa.text(
        "INSERT INTO tenants (id, name, priority_tier, created_at, updated_at) VALUES (:id, :name, :tier, :t, :t)"
    )
    with engine.begin() as conn:
        conn.execute(insert, {"id": old, "name": "old", "tier": 0, "t": NOW})
        conn.execute(insert, {"id": vip, "name": "vip", "tier": 1, "t": NOW})

    assert "0012_tenant_limits.sql" in migrate.upgrade(engine)  # with whatever came after it
    with engine.begin() as conn:
        tiers = dict(conn.execute(sa.text("SELECT name, priority_tier FROM tenants")).all())
        assert tiers == {"old": 2, "vip": 1}
        comment = conn.execute(
            sa.text(
                "SELECT col_description('tenants'::regclass, attnum) FROM pg_attribute WHERE attrelid ="
                " 'tenants'::regclass AND attname = 'priority_tier'"
            )
        ).scalar_one()
        assert "LOWER number is served first" in comment
        new = uuid.uuid4()
        conn.execute(
            sa.text("INSERT INTO tenants (id, name, created_at, updated_at) VALUES (:id, 'new', :t, :t)"),
            {"id": new, "t": NOW},
        )
        assert conn.execute(
            sa.text("SELECT priority_tier, rate_limit_burst FROM tenants WHERE id = :id"), {"id": new}
        ).one() == (2, None)
    for bad in ("priority_tier = 0", "priority_tier = 6", "rate_limit_burst = 0"):
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE tenants SET {bad} WHERE id = :id"), {"id": vip})
