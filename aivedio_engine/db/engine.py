"""One place that turns Settings into a SQLAlchemy Engine, for both dialects.

SQLite (embedded mode) is used from several worker threads in one process, so connections are shared across
threads, the journal is WAL (readers never block the writer) and lock waits are bounded by busy_timeout.
pysqlite's own transaction handling is replaced by an explicit BEGIN (the SQLAlchemy-documented recipe): its
legacy mode does not open a transaction before SELECT or DDL, which silently breaks read-decide-write and
makes DDL non-transactional. A connection can ask for `BEGIN IMMEDIATE` (take the write lock up front, so a
read-then-write transaction cannot fail with "database is locked" halfway) with
`conn.execution_options(sqlite_begin="IMMEDIATE")` before its first statement.

PostgreSQL uses psycopg 3 with a bounded pool; the statement timeout is set per session so a stuck query
cannot hold row locks for minutes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from aivedio_engine.config import Settings

#: the one execution option the SQLite begin hook understands: "DEFERRED" (default) or "IMMEDIATE".
SQLITE_BEGIN_OPTION = "sqlite_begin"


def make_engine(settings: Settings, **engine_kwargs: Any) -> Engine:
    """Engine for `settings.database_url`; extra keyword arguments go to `sqlalchemy.create_engine`."""
    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, settings, **engine_kwargs)
    if url.get_backend_name() == "postgresql":
        return _postgres_engine(url, settings, **engine_kwargs)
    raise sa.exc.ArgumentError(f"unsupported database URL scheme {url.drivername!r}: use sqlite or postgresql+psycopg")


def _postgres_engine(url: sa.URL, settings: Settings, **kw: Any) -> Engine:
    db = settings.database
    if url.drivername == "postgresql":
        # a bare postgresql:// URL would pick psycopg2, which is not a dependency
        url = url.set(drivername="postgresql+psycopg")
    kw.setdefault("pool_size", db.pool_size)
    # No pre-ping: it cost a round trip per checkout. A connection the server dropped fails its first statement
    # once; SQLAlchemy then invalidates the whole pool (every older connection is replaced on its next checkout),
    # the hot create path retries on a fresh one, and connections are recycled before idle timeouts bite.
    kw.setdefault("pool_pre_ping", False)
    kw.setdefault("pool_recycle", 1800)
    kw.setdefault("pool_timeout", db.connect_timeout_s)  # waiting for a pooled connection counts too
    connect_args = {
        # libpq takes whole seconds (and treats 1 as 2)
        "connect_timeout": max(1, math.ceil(db.connect_timeout_s)),
        "options": f"-c statement_timeout={db.statement_timeout_ms}",
    }
    connect_args.update(kw.pop("connect_args", {}))
    engine = sa.create_engine(url, connect_args=connect_args, **kw)
    bound = db.connect_timeout_s

    @sa.event.listens_for(engine, "do_connect")
    def _bounded_connect(dialect: Any, _rec: Any, cargs: Any, cparams: Any) -> Any:
        return bounded_connect(lambda: dialect.connect(*cargs, **cparams), bound)

    from aivedio_engine.db.wakeup import install_pg_notifier

    install_pg_notifier(engine)
    return engine


def bounded_connect(connect: Callable[[], Any], timeout_s: float) -> Any:
    """Give up on a connection attempt after `timeout_s`, which may be below libpq's 2 s minimum.

    A database that hangs (host gone, SYN or startup packet unanswered) must turn into a fast 503, not a request
    stuck for libpq's timeout. The attempt keeps running in its thread; if it succeeds late, the connection is
    closed rather than leaked.
    """
    import psycopg

    done = threading.Event()
    outcome: dict[str, Any] = {}
    abandoned = threading.Event()

    def attempt() -> None:
        try:
            outcome["conn"] = connect()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc
        done.set()
        if abandoned.is_set() and "conn" in outcome:
            outcome["conn"].close()

    threading.Thread(target=attempt, name="db-connect", daemon=True).start()
    if not done.wait(timeout_s):
        abandoned.set()
        if done.is_set() and "conn" in outcome:  # finished in the gap: keep it after all
            return outcome["conn"]
        raise psycopg.OperationalError(f"connection timeout expired after {timeout_s:g}s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["conn"]


def _sqlite_engine(url: sa.URL, settings: Settings, **kw: Any) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    connect_args = {"check_same_thread": False}
    connect_args.update(kw.pop("connect_args", {}))
    engine = sa.create_engine(url, connect_args=connect_args, **kw)
    busy_timeout_ms = settings.database.statement_timeout_ms

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # autocommit at the driver level: transactions are begun explicitly below
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")  # off by default in SQLite; the schema relies on FKs
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # WAL + NORMAL stays consistent after a crash; only the last commits may roll back on power loss
            cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = str(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")).upper()
        if mode not in {"DEFERRED", "IMMEDIATE", "EXCLUSIVE"}:
            raise ValueError(f"{SQLITE_BEGIN_OPTION} must be DEFERRED, IMMEDIATE or EXCLUSIVE, not {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine
