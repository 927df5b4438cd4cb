"""Short write transactions that behave the same on both dialects."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql, sqlite

from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION

_T = TypeVar("_T")


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


@contextmanager
def pg_transaction(conn: Connection) -> Iterator[Any]:
    """Run the caller's transaction with BEGIN and COMMIT sent as statements inside pipelines, so neither costs a
    round trip of its own (psycopg in transaction mode sends BEGIN and syncs before the first statement).

    The driver connection is in autocommit while the caller works; SQLAlchemy statements run on it inside the
    server-side transaction. On any error the transaction is rolled back; the connection leaves in its normal
    mode either way."""
    from psycopg.pq import TransactionStatus

    raw: Any = conn.connection.driver_connection
    raw.autocommit = True
    try:
        yield raw
    except BaseException:
        if not raw.broken:
            raw.rollback()  # psycopg's own: it also forgets the prepared statements the abort lost
        raise
    finally:
        if not raw.broken and raw.info.transaction_status == TransactionStatus.IDLE:
            raw.autocommit = False
        else:
            conn.invalidate()


def dialect_insert(conn: Connection) -> Any:
    """The INSERT construct with ON CONFLICT of the connection's dialect (`postgresql.insert` or `sqlite.insert`)."""
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def for_transaction(conn: Connection, key: str, make: Callable[[], _T]) -> _T | None:
    """State that lives as long as the caller's SQLAlchemy transaction: `make()`'s value, kept on the connection
    under `key` and made anew for the next transaction, so a pooled connection never carries it over. None
    outside an SQLAlchemy transaction."""
    txn = conn.get_transaction()
    if txn is None:
        return None
    noted = conn.info.get(key)
    if noted is None or noted[0]() is not txn:
        noted = (weakref.ref(txn), make())
        conn.info[key] = noted
    value: _T = noted[1]
    return value


def run_prebuilt(conn: Connection, stmt: Any, params: dict[str, Any]) -> Any:
    """Execute a statement built once (module level or `functools.cache`) whose every bind is a named
    `bindparam` given in `params`. On PostgreSQL it is compiled once and sent straight to the driver connection,
    each value through the bind processor SQLAlchemy would apply; returns the psycopg cursor (`rowcount`,
    `fetchone()`). SQLAlchemy's per-execute work around an already compiled statement (execution context, parameter
    construction, result set-up) was ~20 % of the reducer's CPU. SQLite: `conn.execute`."""
    if conn.dialect.name != "postgresql":
        return conn.execute(stmt, params)
    raw: Any = conn.connection.driver_connection
    if not (raw.autocommit or conn.in_transaction()):
        # SQLAlchemy has not begun: it would not commit what psycopg's own implicit BEGIN opened
        return conn.execute(stmt, params)
    sql, processors = _prebuilt(stmt, conn.dialect)
    for name, process in processors:
        params[name] = process(params[name])
    return raw.execute(sql, params)


async def run_prebuilt_on_loop(raw: Any, stmt: Any, params: dict[str, Any]) -> Any:
    """`run_prebuilt` on an async psycopg connection (the API's loop pool, `db/async_pool.py`): the same Core
    statement the blocking path runs, compiled once for psycopg. Returns the cursor."""
    sql, processors = _prebuilt(stmt, _PSYCOPG)
    for name, process in processors:
        params[name] = process(params[name])
    return await raw.execute(sql, params, prepare=True)


_PSYCOPG: Any = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it unannotated
_PREBUILT: dict[int, tuple[Any, str, tuple[tuple[str, Any], ...]]] = {}


def _prebuilt(stmt: Any, dialect: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
    hit = _PREBUILT.get(id(stmt))
    if hit is None or hit[0] is not stmt:
        compiled = stmt.compile(dialect=dialect)
        # the processors SQLAlchemy itself applies at execute (JSONB values wrapped for psycopg, ...); private, but
        # the one map that matches them to the compiled names (tests/integration/test_run_prebuilt.py checks it)
        processors = tuple((n, p) for n, p in compiled._bind_processors.items() if p is not None)
        hit = _PREBUILT[id(stmt)] = (stmt, compiled.string, processors)
    return hit[1], hit[2]
