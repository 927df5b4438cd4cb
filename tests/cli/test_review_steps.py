"""manual_required System B steps in the one review queue: the step's failure opens an item in the
same transaction, and `aivedio review approve|reject` moves the step (approve → success and the project runs on,
reject → failed) with the item closed and the decision audited. Generation items are covered by
test_review_cli.py; these tests make sure step items go through the same commands."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import audit_log, review_items
from aivedio_engine.domain.workflow import ErrorCode
from tests.support.app import make_context, tenant_with_key

runner = CliRunner()
ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = None if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))
    context = make_context(tmp_path / "data", url)
    context.__dict__["_cli_sets"] = [f"data_dir={tmp_path / 'data'}", *([f"database.url={url}"] if url else [])]
    yield context
    context.close()


def cli(ctx: AppContext, *args: str) -> Any:
    sets: list[str] = ctx.__dict__["_cli_sets"]
    return runner.invoke(app, [a for s in sets for a in ("--set", s)] + list(args))


def escalated(ctx: AppContext) -> tuple[uuid.UUID, str]:
    """A project whose photo_check step went to a person (a face-consistency-like manual code)."""
    tenant = tenant_with_key(ctx, "acme")
    project, _ = ctx.workflows.create(
        tenant.tenant_id, "photo_story", user_ref="u1", input={"photo_asset_id": "x", "script": "One."}
    )
    (step,) = ctx.workflows.claim(ALL_QUEUES)
    moved = ctx.workflows.report_failure(step.id, ErrorCode.MODERATION_WARNING, "the moderation verdict was warn")
    assert moved.status.value == "manual_required"
    return project.id, step.step_key


def open_item(ctx: AppContext) -> dict[str, Any]:
    result = cli(ctx, "review", "list", "--state", "pending", "--json")
    assert result.exit_code == 0, result.output
    (item,) = json.loads(result.stdout)
    return dict(item)


def test_escalated_step_is_queued_and_approval_resumes_the_project(ctx: AppContext) -> None:
    project_id, key = escalated(ctx)
    item = open_item(ctx)
    assert (item["project_id"], item["step_key"], item["task_id"], item["task_status"]) == (
        str(project_id),
        key,
        None,
        "manual_required",
    )
    assert "MODERATION_WARNING" in item["reason"]
    assert ctx.workflows.get(project_id).project.status.value == "needs_attention"

    result = cli(ctx, "review", "approve", item["id"], "--as", "alice", "--reason", "checked by hand", "--yes")
    assert result.exit_code == 0, result.output
    assert f"project {project_id} step {key} → success" in result.stdout
    view = ctx.workflows.get(project_id)
    assert {s.step_key: s.status.value for s in view.steps}[key] == "success"
    assert view.project.status.value == "running" and "plan" in {s.step_key for s in view.steps}  # it went on
    with ctx.engine.connect() as conn:
        row = conn.execute(sa.select(review_items).where(review_items.c.id == uuid.UUID(item["id"]))).one()
        audited = conn.execute(sa.select(audit_log.c.command).where(audit_log.c.command == "review approve")).all()
    assert (row.state, row.decided_by, row.note) == ("APPROVED", "alice", "checked by hand")
    assert len(audited) == 1
    # decided once: a second decision is refused, the step stays as it is
    again = cli(ctx, "review", "reject", item["id"], "--as", "bob", "--reason", "no", "--yes")
    assert again.exit_code == 4 and "already approved" in again.stderr


def test_rejection_fails_the_step_and_a_dry_run_changes_nothing(ctx: AppContext) -> None:
    project_id, key = escalated(ctx)
    item = open_item(ctx)
    dry = cli(ctx, "review", "reject", item["id"], "--as", "bob", "--reason", "bad", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert {s.step_key: s.status.value for s in ctx.workflows.get(project_id).steps}[key] == "manual_required"
    result = cli(ctx, "review", "reject", item["id"], "--as", "bob", "--reason", "bad output", "--yes")
    assert result.exit_code == 0, result.output
    view = ctx.workflows.get(project_id)
    assert {s.step_key: s.status.value for s in view.steps}[key] == "failed"
    assert view.project.status.value == "failed"
    assert cli(ctx, "review", "list", "--state", "pending", "--json").stdout.strip() == "[]"


def test_a_retry_or_cancel_closes_the_item(ctx: AppContext) -> None:
    project_id, key = escalated(ctx)
    item = open_item(ctx)
    ctx.workflows.retry_step(project_id, key)
    assert cli(ctx, "review", "list", "--state", "pending", "--json").stdout.strip() == "[]"
    # the step escalates again: a new item; cancelling the project closes it too
    (step,) = ctx.workflows.claim(ALL_QUEUES)
    ctx.workflows.report_failure(step.id, ErrorCode.MODERATION_WARNING, "again")
    second = open_item(ctx)
    assert second["id"] != item["id"]
    ctx.workflows.cancel(project_id)
    assert cli(ctx, "review", "list", "--state", "pending", "--json").stdout.strip() == "[]"
    refused = cli(ctx, "review", "approve", second["id"], "--as", "a", "--reason", "late", "--yes")
    assert refused.exit_code == 4, refused.output
