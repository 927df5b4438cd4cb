"""The migration runner: apply once, refuse edited history, roll back failed files, serialize concurrent runs."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate, tables
from aivedio_engine.db.engine import make_engine
from aivedio_engine.domain.status import AttemptStatus
from tests.integration.test_schema import _attempt, _task, _tenant

ALL = [m.name for m in migrate.discover()]


@pytest.fixture
def engine(pg_empty_url: str) -> Iterator[sa.Engine]:
    """A database nothing was applied to yet."""
    eng = make_engine(load_settings(overrides={"database": {"url": pg_empty_url}}))
    yield eng
    eng.dispose()


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    """A private copy of sql/migrations that a test may edit."""
    return Path(shutil.copytree(migrate.DEFAULT_MIGRATIONS_DIR, tmp_path / "migrations"))


def _states(engine: sa.Engine, directory: Path | None = None) -> dict[str, str]:
    return {s.name: s.state for s in migrate.status(engine, directory)}


def _recorded(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.schema_migrations.c.name).order_by("name")).scalars())


def _has_table(engine: sa.Engine, name: str) -> bool:
    return sa.inspect(engine).has_table(name)


# --- file discovery (no database) ---------------------------------------------------------------------------


def test_repository_migrations_are_well_formed() -> None:
    assert ALL == sorted(ALL) and ALL[0].startswith("0001_")
    assert all(len(m.sha256) == 64 for m in migrate.discover())


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("1_short.sql", "SELECT 1;", "bad migration file name"),
        ("9997_Upper.sql", "SELECT 1;", "bad migration file name"),
        ("0001_again.sql", "SELECT 1;", "two migrations numbered 0001"),
        ("9998_tx.sql", "BEGIN;\nCREATE TABLE x (id int);\nCOMMIT;\n", "transaction control"),
    ],
)
def test_discover_rejects_bad_files(migrations: Path, name: str, text: str, match: str) -> None:
    (migrations / name).write_text(text)
    with pytest.raises(migrate.InvalidMigration, match=match):
        migrate.discover(migrations)


def test_checksum_ignores_line_endings() -> None:
    assert migrate.checksum("SELECT 1;\r\nSELECT 2;\r\n") == migrate.checksum("SELECT 1;\nSELECT 2;\n")


# --- PostgreSQL ---------------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_status_is_read_only_and_all_pending_on_empty_database(engine: sa.Engine) -> None:
    assert _states(engine) == dict.fromkeys(ALL, migrate.PENDING)
    assert sa.inspect(engine).get_table_names() == []


@pytest.mark.postgres
def test_upgrade_applies_everything_once_and_releases_the_lock(engine: sa.Engine, pg_empty_dsn: str) -> None:
    assert migrate.upgrade(engine) == ALL
    assert migrate.upgrade(engine) == []
    states = migrate.status(engine)
    assert [(s.name, s.state) for s in states] == [(n, migrate.APPLIED) for n in ALL]
    assert all(s.applied_at is not None and s.applied_at.tzinfo is not None for s in states)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as other:
        assert other.execute("SELECT pg_try_advisory_lock(%s)", (migrate.ADVISORY_LOCK_KEY,)).fetchone() == (True,)


@pytest.mark.postgres
def test_edited_applied_migration_is_refused_before_anything_runs(engine: sa.Engine, migrations: Path) -> None:
    migrate.upgrade(engine, migrations)
    edited = migrations / ALL[1]
    edited.write_text(edited.read_text() + "\n-- an innocent-looking edit\n")
    (migrations / "0099_new_table.sql").write_text("CREATE TABLE new_table (id int);\n")

    states = _states(engine, migrations)
    assert states[ALL[1]] == migrate.CHECKSUM_MISMATCH
    assert states["0099_new_table.sql"] == migrate.PENDING
    with pytest.raises(migrate.ChecksumMismatch, match=ALL[1]):
        migrate.upgrade(engine, migrations)
    assert not _has_table(engine, "new_table")
    assert _recorded(engine) == ALL


@pytest.mark.postgres
def test_failed_migration_leaves_no_trace(engine: sa.Engine, migrations: Path) -> None:
    (migrations / "0099_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\nINSERT INTO half_done VALUES (1);\nCREATE TABLE broken (;\n"
    )
    with pytest.raises(migrate.MigrationFailed, match="0099_broken.sql") as exc:
        migrate.upgrade(engine, migrations)
    assert exc.value.applied == ALL  # the good files before it stay applied, each in its own transaction
    assert not _has_table(engine, "half_done")
    assert _recorded(engine) == ALL
    assert _states(engine, migrations)["0099_broken.sql"] == migrate.PENDING

    (migrations / "0099_broken.sql").write_text("CREATE TABLE half_done (id int);\n")  # fixed: applies now
    assert migrate.upgrade(engine, migrations) == ["0099_broken.sql"]
    assert _has_table(engine, "half_done")


@pytest.mark.postgres
def test_file_removed_after_apply_is_reported_not_refused(engine: sa.Engine, migrations: Path) -> None:
    migrate.upgrade(engine, migrations)
    (migrations / ALL[-1]).unlink()
    assert _states(engine, migrations)[ALL[-1]] == migrate.MISSING_FILE
    assert migrate.upgrade(engine, migrations) == []


def _advisory_waiters(admin: psycopg.Connection) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgres
def test_concurrent_upgrades_apply_each_file_exactly_once(engine: sa.Engine, pg_empty_dsn: str) -> None:
    """Both runners are parked on the advisory lock before either starts, so they really overlap."""
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = migrate.upgrade(engine)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    with psycopg.connect(pg_empty_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (migrate.ADVISORY_LOCK_KEY,))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        # wait for an observable condition (both blocked in pg_advisory_lock), not for a guessed duration
        deadline = time.monotonic() + 20
        while _advisory_waiters(admin) < 2 and not errors and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert _advisory_waiters(admin) == 2, f"runners did not both wait for the lock: {errors}"
        admin.execute("SELECT pg_advisory_unlock(%s)", (migrate.ADVISORY_LOCK_KEY,))
        for t in threads:
            t.join(timeout=60)
    assert errors == []
    assert sorted(results[0] + results[1]) == ALL
    assert [] in (results[0], results[1])
    assert _recorded(engine) == ALL


@pytest.mark.postgres
def test_lock_wait_is_bounded(engine: sa.Engine, pg_empty_dsn: str) -> None:
    with psycopg.connect(pg_empty_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (migrate.ADVISORY_LOCK_KEY,))
        with pytest.raises(migrate.MigrationError, match="migration lock"):
            migrate.upgrade(engine, lock_timeout_s=0.2)
    assert sa.inspect(engine).get_table_names() == []


# --- SQLite (embedded mode) ---------------------------------------------------------------------------------


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"data_dir": str(tmp_path / "data")}))
    yield eng
    eng.dispose()


def test_embedded_upgrade_creates_every_mirror_table(sqlite_engine: sa.Engine) -> None:
    name, _ = migrate.embedded_marker()
    assert [(s.name, s.state) for s in migrate.status(sqlite_engine)] == [(name, migrate.PENDING)]
    assert migrate.upgrade(sqlite_engine) == [name]
    assert set(sa.inspect(sqlite_engine).get_table_names()) == set(tables.metadata.tables)
    assert migrate.upgrade(sqlite_engine) == []
    assert [(s.name, s.state) for s in migrate.status(sqlite_engine)] == [(name, migrate.APPLIED)]
    with sqlite_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_embedded_schema_enforces_keys_and_partial_indexes(sqlite_engine: sa.Engine) -> None:
    migrate.upgrade(sqlite_engine)
    with sqlite_engine.begin() as conn:
        task_id = _task(conn, _tenant(conn))
        _attempt(conn, task_id, 1, AttemptStatus.SENDING)
    with pytest.raises(sa.exc.IntegrityError, match="UNIQUE"), sqlite_engine.begin() as conn:
        _attempt(conn, task_id, 2, AttemptStatus.NEW)
    with pytest.raises(sa.exc.IntegrityError, match="FOREIGN KEY"), sqlite_engine.begin() as conn:
        _task(conn, tenant_id=uuid.uuid4())
    with pytest.raises(sa.exc.IntegrityError, match="CHECK"), sqlite_engine.begin() as conn:
        conn.execute(tables.generation_tasks.update().values(status="DONE"))


def test_embedded_database_from_another_schema_is_refused(sqlite_engine: sa.Engine) -> None:
    migrate.upgrade(sqlite_engine)
    with sqlite_engine.begin() as conn:
        conn.execute(tables.schema_migrations.update().values(name="embedded:0000000000000000"))
    assert [s.state for s in migrate.status(sqlite_engine)] == [migrate.CHECKSUM_MISMATCH, migrate.PENDING]
    with pytest.raises(migrate.ChecksumMismatch, match="another aivedio version"):
        migrate.upgrade(sqlite_engine)


@pytest.mark.postgres
def test_engine_applies_session_settings(pg_url: str) -> None:
    settings = load_settings(overrides={"database": {"url": pg_url, "statement_timeout_ms": 1234, "pool_size": 3}})
    eng = make_engine(settings)
    try:
        with eng.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "1234ms"
        assert eng.pool.size() == 3  # type: ignore[attr-defined]
    finally:
        eng.dispose()


def test_sqlite_engine_can_take_the_write_lock_up_front(sqlite_engine: sa.Engine) -> None:
    migrate.upgrade(sqlite_engine)
    with sqlite_engine.connect().execution_options(sqlite_begin="IMMEDIATE") as a, a.begin():
        a.execute(tables.tenants.delete())  # holds the write lock until commit
        other = make_engine(
            load_settings(
                overrides={
                    "data_dir": str(Path(sqlite_engine.url.database or "").parent),
                    "database": {"statement_timeout_ms": 100},
                }
            )
        )
        try:
            with (
                pytest.raises(sa.exc.OperationalError, match="locked"),
                other.connect().execution_options(sqlite_begin="IMMEDIATE") as b,
                b.begin(),
            ):
                pass
        finally:
            other.dispose()
