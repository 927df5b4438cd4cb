"""Readiness probes."""

from __future__ import annotations

from aivedio_engine.db import server
from aivedio_engine.db.handles import Engine, SQLAlchemyError


def database_ready(engine: Engine) -> tuple[bool, str]:
    try:
        with engine.connect() as conn:
            server.ping(conn)
    except SQLAlchemyError:
        return False, "unreachable"
    return True, "ok"
