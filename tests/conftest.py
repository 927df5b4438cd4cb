"""Shared fixtures: a scrubbed environment, and throwaway PostgreSQL databases.

PostgreSQL tests skip when the server is unreachable on a developer machine, but fail under CI=true,
where `.ci/run` guarantees the server is up.

Migrating a fresh database for every test costs more than copying a migrated one, so once per session the
migrations are applied to a template database, `aivedio_tmpl_<hash of sql/migrations/*.sql, the runner and
this file>`, and `pg_dsn`/`pg_url` hand each test its own `CREATE DATABASE ... TEMPLATE` copy of it: the schema
at head, exactly as `migrate.upgrade` leaves it (calling upgrade on it again applies nothing). Tests of the
migration runner itself, which need a database nothing was applied to, take `pg_empty_dsn`/`pg_empty_url`.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from aivedio_engine.db import migrate
from tests.support.workers import worker_id

#: fixture modules every test can use without importing them (sim, sim_factory, callback_sink; moto_s3;
#: database_url, seeder; restore_logging; listener)
pytest_plugins = [
    "tests.support.sim",
    "tests.support.moto",
    "tests.support.seeding",
    "tests.support.logging_state",
    "tests.support.sockets",
]

#: tests marked slow (left out of `bash scripts/test --fast`): whole directories, the crash matrix, and any test
#: that allows itself more than SLOW_TIMEOUT_S
SLOW_DIRS = ("e2e", "chaos")
SLOW_MODULES = ("tests/flow/test_crash_matrix.py",)
SLOW_TIMEOUT_S = 100
#: the fast tier (`-m fast`): these directories without their slow tests; the rest of the suite is `-m "not fast"`
FAST_DIRS = ("unit", "contract", "architecture", "api")

PG_ADMIN_DSN = os.environ.get("AIVEDIO_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TEMPLATE_PREFIX = "aivedio_tmpl_"
#: pg_advisory_lock key serializing template creation across concurrent pytest sessions ("aivtmpl" in ASCII);
#: distinct from migrate.ADVISORY_LOCK_KEY
TEMPLATE_LOCK_KEY = 0x61697674_6D706C00


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent
    for item in items:
        rel = item.path.resolve().relative_to(root.parent).as_posix()
        timeout = item.get_closest_marker("timeout")
        long_timeout = bool(timeout and timeout.args and float(timeout.args[0]) > SLOW_TIMEOUT_S)
        top = rel.split("/")[1]
        if top in SLOW_DIRS or rel in SLOW_MODULES or long_timeout:
            item.add_marker(pytest.mark.slow)
        elif top in FAST_DIRS and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def _scrub_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test sees the developer's AIVEDIO_* variables or picks up ./aivedio.toml by accident."""
    for name in list(os.environ):
        if name.startswith("AIVEDIO_") and name != "AIVEDIO_TEST_PG_DSN":
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def _admin_connect() -> psycopg.Connection:
    try:
        return psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_DSN}: {exc}")


def _dsn_of(name: str) -> str:
    return f"{PG_ADMIN_DSN.rsplit('/', 1)[0]}/{name}"


def _template_name() -> str:
    """Changes whenever a migration file, the runner (which owns schema_migrations) or this file changes."""
    digest = hashlib.sha256()
    for path in [*sorted(migrate.DEFAULT_MIGRATIONS_DIR.glob("*.sql")), Path(migrate.__file__), Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return TEMPLATE_PREFIX + digest.hexdigest()[:12]


def _drop(admin: psycopg.Connection, name: str) -> None:
    db = sql.Identifier(name)
    admin.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(db))  # a template cannot be dropped
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))


def _compact_catalogs(dsn: str) -> None:
    """VACUUM FULL the database's own system catalogs, bloated by the migrations' DDL: every copy is smaller
    and faster to make. Shared catalogs are left alone (they are the whole cluster's), and so are the
    application's tables: vacuuming them would record statistics a freshly migrated database does not have.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND NOT relisshared"
            " AND relnamespace = 'pg_catalog'::regnamespace"
        ).fetchall()
        conn.execute(
            sql.SQL("VACUUM FULL {}").format(sql.SQL(", ").join(sql.Identifier("pg_catalog", n) for (n,) in names))
        )


def _ensure_template(name: str, *, drop_others: bool) -> None:
    """Create and migrate the template unless it exists; with drop_others, drop templates of other migration sets.

    Under a session advisory lock, so concurrent pytest runs neither build it twice nor see it half-built:
    it is migrated under a `_building` name and renamed when done, so a run killed midway leaves no template
    that looks finished (the leftover is dropped by the next run). The finished template refuses connections,
    since `CREATE DATABASE ... TEMPLATE` fails while anyone is connected to it.
    """
    with _admin_connect() as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            existing = admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (TEMPLATE_PREFIX.replace("_", r"\_") + "%",)
            ).fetchall()
            for (other,) in existing:
                # another migration set, or a build that never finished (nobody builds while we hold the lock)
                if other == name + "_building" or (drop_others and other != name):
                    _drop(admin, other)
            if (name,) in existing:
                return
            building = name + "_building"
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
            # a bare engine, not make_engine(load_settings()): this runs before the first test's _scrub_env, so
            # settings would come from the developer's AIVEDIO_* variables and ./aivedio.toml
            url = _dsn_of(building).replace("postgresql://", "postgresql+psycopg://", 1)
            engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
            try:
                migrate.upgrade(engine, migrate.DEFAULT_MIGRATIONS_DIR)
            finally:
                engine.dispose()
            _compact_catalogs(_dsn_of(building))
            admin.execute(
                sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                    sql.Identifier(building)
                )
            )
            admin.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name))
            )
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))


@pytest.fixture(scope="session")
def pg_template() -> str:
    """Name of the migrated template database, created on first use in the session."""
    name = _template_name()
    _ensure_template(name, drop_others=True)
    return name


def _throwaway_database(template: str | None) -> Iterator[str]:
    name = f"aivedio_t_{worker_id()}_{uuid.uuid4().hex[:12]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    with _admin_connect() as admin:
        if template is None:
            admin.execute(create)
        else:
            clone = create + sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
            try:
                admin.execute(clone)
            except psycopg.errors.InvalidCatalogName:
                # a session of another checkout (other migrations) started meanwhile and dropped it as stale:
                # build it again, leaving that session's template alone so the two do not take turns
                _ensure_template(template, drop_others=False)
                admin.execute(clone)
    try:
        yield _dsn_of(name)
    finally:
        with _admin_connect() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def pg_dsn(pg_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database (libpq DSN) with every migration applied, for one test, dropped afterwards."""
    yield from _throwaway_database(pg_template)


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """The same database as a SQLAlchemy URL (psycopg 3 driver)."""
    return pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def pg_empty_dsn() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (libpq DSN): for tests of the migration runner itself."""
    yield from _throwaway_database(None)


@pytest.fixture
def pg_empty_url(pg_empty_dsn: str) -> str:
    """The empty database as a SQLAlchemy URL (psycopg 3 driver)."""
    return pg_empty_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
