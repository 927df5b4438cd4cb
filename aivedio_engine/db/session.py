"""Short write transactions that behave the same on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine

from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write. SQLite takes its write lock up front (BEGIN IMMEDIATE), so a
    read-decide-write sequence cannot fail half-way with "database is locked"; PostgreSQL uses row locks."""
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            conn = conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with conn.begin():
            yield conn


@contextmanager
def read_conn(engine: Engine) -> Iterator[Connection]:
    """A connection for reads only, in autocommit: no BEGIN, and no ROLLBACK at check-in, which on psycopg would
    also throw away the connection's prepared statements."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn
