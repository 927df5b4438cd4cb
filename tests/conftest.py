"""Shared fixtures: a scrubbed environment, and throwaway PostgreSQL databases.

PostgreSQL tests skip when the server is unreachable on a developer machine, but fail under CI=true,
where `.ci/run` guarantees the server is up.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

PG_ADMIN_DSN = os.environ.get("AIVEDIO_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


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


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (libpq DSN) for one test, dropped afterwards."""
    name = f"aivedio_t_{uuid.uuid4().hex[:12]}"
    with _admin_connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_DSN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_dsn: str) -> str:
    """The same database as a SQLAlchemy URL (psycopg 3 driver)."""
    return pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
