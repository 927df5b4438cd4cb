"""Questions to the database server itself rather than to the engine's tables: is it there, what is it, and how
long may the statements of one transaction run."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import Connection


def ping(conn: Connection) -> None:
    """One round trip; raises if the server cannot answer."""
    conn.execute(sa.text("SELECT 1"))


def product_version(conn: Connection) -> tuple[str, str]:
    """(product name, server version)."""
    if conn.dialect.name == "postgresql":
        return "PostgreSQL", str(conn.execute(sa.text("SHOW server_version")).scalar_one())
    return "SQLite", str(conn.execute(sa.text("SELECT sqlite_version()")).scalar_one())


def limit_statement_time(conn: Connection, timeout_ms: float) -> None:
    """Bound every statement of the caller's open transaction to `timeout_ms` (SET LOCAL: it ends with the
    transaction). SQLite has no statement timeout; its reads never block, so there it does nothing."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(timeout_ms)}"))
