"""Forward-only migration runner: `sql/migrations/NNNN_slug.sql`, one transaction per file, checksummed.

PostgreSQL: pending files are applied in name order, each in its own transaction together with its
`schema_migrations` row, so a file is either fully applied and recorded or not at all (PostgreSQL DDL is
transactional). A session advisory lock serializes concurrent upgrades (several replicas starting at once);
the loser re-reads what is applied after the lock is granted and finds nothing left to do. An applied file
whose content changed is refused before anything runs: the database no longer matches what the file says.

SQLite (embedded mode) has no migrations: the schema is created from the mirror in `tables.py`, and a marker
row `embedded:<ddl hash>` records which mirror created it, so a database made by another version is reported
instead of drifting silently.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.schema import CreateIndex, CreateTable

from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION
from aivedio_engine.db.tables import metadata, schema_migrations

MIGRATIONS_DIR_ENV = "AIVEDIO_MIGRATIONS_DIR"
DEFAULT_MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "sql" / "migrations"
NAME_PATTERN = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
#: pg_advisory_lock key shared by every aivedio process ("aivedio" in ASCII); any constant works.
ADVISORY_LOCK_KEY = 0x61697665_64696F00
EMBEDDED_PREFIX = "embedded:"

APPLIED, PENDING, CHECKSUM_MISMATCH, MISSING_FILE = "applied", "pending", "checksum_mismatch", "missing_file"

# Transaction control inside a file would break "one file, one transaction".
_TX_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION)\s*;", re.IGNORECASE | re.MULTILINE)

# The runner creates its own bookkeeping table; kept identical to tables.schema_migrations (drift-tested).
_CREATE_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name        text         NOT NULL,
    sha256      text         NOT NULL,
    applied_at  timestamptz  NOT NULL,
    CONSTRAINT pk_schema_migrations PRIMARY KEY (name)
)"""


class MigrationError(Exception):
    """Anything that stops an upgrade; the message is one line meant for the operator."""


class InvalidMigration(MigrationError):
    pass


class ChecksumMismatch(MigrationError):
    pass


class MigrationFailed(MigrationError):
    def __init__(self, name: str, error: str, applied: list[str]) -> None:
        done = f" (applied before it: {', '.join(applied)})" if applied else ""
        super().__init__(f"migration {name} failed and was rolled back: {error}{done}")
        self.name, self.applied = name, applied


@dataclass(frozen=True)
class Migration:
    name: str
    path: Path
    sha256: str


@dataclass(frozen=True)
class MigrationState:
    name: str
    #: the file's checksum; the recorded one when the file is missing
    sha256: str
    state: str
    applied_at: datetime | None = None
    recorded_sha256: str | None = None


def migrations_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """explicit argument > $AIVEDIO_MIGRATIONS_DIR > sql/migrations next to the package."""
    chosen = explicit or os.environ.get(MIGRATIONS_DIR_ENV)
    return Path(chosen) if chosen else DEFAULT_MIGRATIONS_DIR


def checksum(text: str) -> str:
    # line endings normalised: a Windows checkout must not look like an edited migration
    return hashlib.sha256(text.replace("\r\n", "\n").encode("utf-8")).hexdigest()


def discover(directory: str | os.PathLike[str] | None = None) -> list[Migration]:
    root = migrations_dir(directory)
    if not root.is_dir():
        raise InvalidMigration(f"migrations directory not found: {root}")
    found: list[Migration] = []
    numbers: dict[str, str] = {}
    for path in sorted(root.glob("*.sql")):
        if not NAME_PATTERN.match(path.name):
            raise InvalidMigration(f"bad migration file name {path.name}: expected NNNN_lowercase_slug.sql")
        number = path.name[:4]
        if number in numbers:
            raise InvalidMigration(f"two migrations numbered {number}: {numbers[number]} and {path.name}")
        numbers[number] = path.name
        text = path.read_text(encoding="utf-8")
        if _TX_CONTROL.search(text):
            raise InvalidMigration(f"{path.name} contains transaction control; the runner wraps each file in one")
        found.append(Migration(path.name, path, checksum(text)))
    return found


def status(engine: Engine, directory: str | os.PathLike[str] | None = None) -> list[MigrationState]:
    """Read-only: what is applied, pending, changed since applied, or applied but no longer on disk."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            return _embedded_states(conn)
    _require_postgres(engine)
    files = discover(directory)
    with engine.connect() as conn:
        return _compare(files, _recorded(conn))


def upgrade(
    engine: Engine,
    directory: str | os.PathLike[str] | None = None,
    *,
    lock_timeout_s: float = 300.0,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[str]:
    """Apply every pending migration; returns the names applied (empty when up to date)."""
    if engine.dialect.name == "sqlite":
        return _embedded_upgrade(engine, clock)
    _require_postgres(engine)
    files = discover(directory)
    with engine.connect() as conn:
        _lock(conn, lock_timeout_s)
        try:
            with conn.begin():
                conn.exec_driver_sql(_CREATE_SCHEMA_MIGRATIONS)
            with conn.begin():
                states = _compare(files, _recorded(conn))
            _refuse_mismatch(states)
            pending = {s.name for s in states if s.state == PENDING}
            applied: list[str] = []
            for m in (f for f in files if f.name in pending):
                _apply_one(conn, m, clock(), applied)
                applied.append(m.name)
            return applied
        finally:
            _unlock(conn)


def _apply_one(conn: Connection, m: Migration, now: datetime, applied: list[str]) -> None:
    text = m.path.read_text(encoding="utf-8")
    if checksum(text) != m.sha256:
        raise MigrationFailed(m.name, "file changed while upgrading", applied)
    try:
        with conn.begin():
            # migrations may legitimately run longer than the service's statement timeout (index builds)
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            # the raw psycopg cursor with no parameters uses the simple query protocol: multi-statement
            # files and dollar-quoted function bodies run as written
            with conn.connection.dbapi_connection.cursor() as cur:  # type: ignore[union-attr]
                cur.execute(text)
            conn.execute(schema_migrations.insert().values(name=m.name, sha256=m.sha256, applied_at=now))
    except (psycopg.Error, sa.exc.DBAPIError) as exc:
        raise MigrationFailed(m.name, _first_line(exc), applied) from exc


def _lock(conn: Connection, timeout_s: float) -> None:
    try:
        with conn.begin():
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(timeout_s * 1000))}")
            conn.execute(sa.select(sa.func.pg_advisory_lock(ADVISORY_LOCK_KEY)))
    except sa.exc.OperationalError as exc:
        if isinstance(exc.orig, psycopg.errors.QueryCanceled):
            raise MigrationError(f"another upgrade held the migration lock for more than {timeout_s:g}s") from exc
        raise


def _unlock(conn: Connection) -> None:
    try:
        if conn.in_transaction():
            conn.rollback()
        conn.execute(sa.select(sa.func.pg_advisory_unlock(ADVISORY_LOCK_KEY)))
        conn.commit()
    except sa.exc.DBAPIError:
        # a session lock outlives the transaction: if it cannot be released, end the session rather than
        # return a lock-holding connection to the pool
        conn.invalidate()


def _recorded(conn: Connection) -> dict[str, tuple[str, datetime]]:
    if not sa.inspect(conn).has_table(schema_migrations.name):
        return {}
    rows = conn.execute(sa.select(schema_migrations.c.name, schema_migrations.c.sha256, schema_migrations.c.applied_at))
    # SQLite drops the offset; every value was written in UTC
    return {name: (sha, at if at.tzinfo else at.replace(tzinfo=UTC)) for name, sha, at in rows}


def _compare(files: list[Migration], recorded: dict[str, tuple[str, datetime]]) -> list[MigrationState]:
    states = []
    for m in files:
        if m.name not in recorded:
            states.append(MigrationState(m.name, m.sha256, PENDING))
            continue
        sha, at = recorded[m.name]
        state = APPLIED if sha == m.sha256 else CHECKSUM_MISMATCH
        states.append(MigrationState(m.name, m.sha256, state, at, sha))
    on_disk = {m.name for m in files}
    states += [MigrationState(n, sha, MISSING_FILE, at, sha) for n, (sha, at) in recorded.items() if n not in on_disk]
    return sorted(states, key=lambda s: s.name)


def _refuse_mismatch(states: list[MigrationState]) -> None:
    bad = [s.name for s in states if s.state == CHECKSUM_MISMATCH]
    if bad:
        raise ChecksumMismatch(
            f"applied migration changed on disk: {', '.join(bad)} (checksum differs from schema_migrations); "
            "migrations are forward-only: restore the file and add a new migration instead"
        )


def _require_postgres(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        raise MigrationError(f"unsupported database dialect {engine.dialect.name!r}")


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


# --- embedded (SQLite) --------------------------------------------------------------------------------------


def embedded_marker() -> tuple[str, str]:
    """(marker name, sha256) of the mirror's SQLite DDL: changes whenever tables.py changes the schema."""
    dialect = sa.create_engine("sqlite://").dialect
    parts = []
    for table in metadata.sorted_tables:
        parts.append(str(CreateTable(table).compile(dialect=dialect)))
        parts += [
            str(CreateIndex(ix).compile(dialect=dialect)) for ix in sorted(table.indexes, key=lambda i: i.name or "")
        ]
    digest = checksum("\n".join(parts))
    return EMBEDDED_PREFIX + digest[:16], digest


def _embedded_states(conn: Connection) -> list[MigrationState]:
    name, digest = embedded_marker()
    recorded = _recorded(conn)
    states = [
        MigrationState(n, sha, APPLIED if n == name else CHECKSUM_MISMATCH, at, sha)
        for n, (sha, at) in sorted(recorded.items())
    ]
    if name not in recorded:
        states.append(MigrationState(name, digest, PENDING))
    return states


def _embedded_upgrade(engine: Engine, clock: Callable[[], datetime]) -> list[str]:
    name, digest = embedded_marker()
    # IMMEDIATE: two processes creating the schema at once serialize on the write lock
    with engine.connect().execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"}) as conn, conn.begin():
        states = _embedded_states(conn)
        stale = [s.name for s in states if s.state == CHECKSUM_MISMATCH]
        if stale:
            raise ChecksumMismatch(
                f"embedded database schema {', '.join(stale)} was created by another aivedio version "
                f"(this one expects {name}); SQLite databases are not migrated: move the data dir away to start fresh"
            )
        if any(s.state == APPLIED for s in states):
            return []
        metadata.create_all(conn)
        conn.execute(schema_migrations.insert().values(name=name, sha256=digest, applied_at=clock()))
    return [name]
