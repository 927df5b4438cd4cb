"""Readiness probes."""

from __future__ import annotations

import sqlalchemy as sa

from aivedio_engine.db.handles import Engine, SQLAlchemyError


def database_ready(engine: Engine) -> tuple[bool, str]:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except SQLAlchemyError:
        return False, "unreachable"
    return True, "ok"
