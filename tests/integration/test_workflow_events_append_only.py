"""A step's history cannot be rewritten in PostgreSQL (0025_workflow_events_append_only): UPDATE, DELETE and
TRUNCATE of workflow_task_events are refused by a trigger, except the redaction that sets a row's payload to
NULL and changes nothing else (`lifecycle.redact_projects`, used by retention and tenant purge)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import lifecycle, migrate
from aivedio_engine.db.tables import workflow_task_events
from tests.chaos.support import MutableClock, insert_tenant


@pytest.fixture
def ctx(pg_url: str) -> Iterator[AppContext]:
    context = build_context(load_settings(overrides={"database": {"url": pg_url}}), clock=MutableClock())
    migrate.upgrade(context.engine)
    yield context
    context.close()


def _events(ctx: AppContext) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(workflow_task_events).order_by(workflow_task_events.c.id)))


def test_step_history_is_append_only_but_redactable(ctx: AppContext) -> None:
    with ctx.engine.begin() as conn:
        tenant = insert_tenant(conn)
    project, _ = ctx.workflows.create(tenant, "photo_story", user_ref="u", input={"script": "One."})
    (step,) = ctx.workflows.claim(["photo_check"])
    ctx.workflows.report_success(step.id, output_json={"ok": True}, summary={"duration_ms": 5})
    before = _events(ctx)
    assert len(before) >= 2 and {"duration_ms": 5} in [e.payload for e in before]

    for statement in (
        "UPDATE workflow_task_events SET to_status = 'failed'",
        "UPDATE workflow_task_events SET payload = '{\"forged\": true}'",
        "UPDATE workflow_task_events SET payload = NULL, error_code = 'X'",  # a redaction may change nothing else
        "DELETE FROM workflow_task_events",
        "TRUNCATE workflow_task_events",
    ):
        with pytest.raises(sa.exc.DBAPIError, match="append-only") as exc, ctx.engine.begin() as conn:
            conn.exec_driver_sql(statement)
        assert isinstance(exc.value.orig, psycopg.errors.RestrictViolation), statement
    assert _events(ctx) == before

    with ctx.engine.begin() as conn:
        assert lifecycle.redact_projects(conn, [project.id]) == 1
    after = _events(ctx)
    assert [e.payload for e in after] == [None] * len(before)
    strip = lambda rows: [(e.id, e.event, e.from_status, e.to_status, e.created_at) for e in rows]  # noqa: E731
    assert strip(after) == strip(before)
    assert all(isinstance(e.id, uuid.UUID) for e in after)
