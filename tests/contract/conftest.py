"""The repository contract suite's database: one migrated database per test, of each dialect."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import TaskStatus
from tests.chaos.support import insert_tasks, insert_tenant
from tests.support.app import make_context


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """The embedded SQLite file, and a copy of the migrated PostgreSQL template: the same repository code runs on
    both, so the embedded tests exercise the production paths."""
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    ctx = make_context(tmp_path / "data", url)
    yield ctx.engine
    ctx.close()


def tenant_and_task(engine: Engine, status: TaskStatus = TaskStatus.QUEUED) -> tuple[uuid.UUID, uuid.UUID]:
    """A tenant (no credits) and one task of it at version 3."""
    with write_tx(engine) as conn:
        tenant = insert_tenant(conn)
        (task,) = insert_tasks(conn, tenant, 1, status=status)
    return tenant, task
