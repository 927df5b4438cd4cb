"""Bringing a test database to the schema just before one migration, to test that migration on old data."""

from __future__ import annotations

import shutil
from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db import migrate


def upgrade_to_before(engine: sa.Engine, name_prefix: str, scratch: Path) -> None:
    """Apply every migration whose file name sorts before `name_prefix` (e.g. "0027"), and none after it."""
    before = scratch / f"before-{name_prefix}"
    before.mkdir()
    for f in sorted(migrate.DEFAULT_MIGRATIONS_DIR.glob("*.sql")):
        if f.name < name_prefix:
            shutil.copy(f, before / f.name)
    migrate.upgrade(engine, before)
