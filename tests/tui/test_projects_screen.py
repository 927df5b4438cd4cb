"""The projects screen (`0`) on a System B project driven through WorkflowService as a worker reports: the list,
Enter for the step tree (status, duration, cost, retries, errors; per-shot steps grouped), `a` approving the
manual_required step and `r` retrying a failed one, each with a reason, audited and visible in the tree."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from textual.pilot import Pilot
from textual.widgets import DataTable, Tree

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import audit_log, review_items
from aivedio_engine.domain.workflow import ErrorCode, StepStatus
from tests.support.app import FakeClock, make_context, tenant_with_key
from tests.tui.conftest import OPERATOR, drive, make_app, press, rows, status_line, type_text
from tui.screens.projects import ProjectDetailScreen, ProjectsScreen
from tui.widgets import ConfirmModal

ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AppContext]:
    context = make_context(tmp_path / "data", clock=FakeClock())
    yield context
    context.close()


def world(ctx: AppContext) -> uuid.UUID:
    """photo_check and plan (2 shots) succeed; image[0] fails for good, image[1] goes to a person."""
    tenant = tenant_with_key(ctx, "acme").tenant_id
    project, _ = ctx.workflows.create(
        tenant, "photo_story", user_ref="u1", input={"photo_asset_id": "p", "script": "a"}
    )
    svc = ctx.workflows
    for key in ("photo_check", "plan"):
        (s,) = svc.claim(ALL_QUEUES)
        ctx.clock.advance(2)  # type: ignore[attr-defined]
        svc.report_success(s.id, output_json={"shots": 2} if key == "plan" else {"ok": True}, cost_actual=Decimal(1))
    started = {s.step_key: s for s in svc.claim(["image"], limit=5)}
    ctx.clock.advance(3)  # type: ignore[attr-defined]
    svc.report_failure(started["image[0]"].id, ErrorCode.INPUT_INVALID, "crop outside the photo")
    svc.report_failure(started["image[1]"].id, ErrorCode.FACE_CONSISTENCY_LOW, "similarity 0.41")
    return project.id


def tree_lines(screen: ProjectDetailScreen) -> list[str]:
    tree: Tree[str] = screen.query_one("#steps", Tree)
    out = []
    for line in range(tree.last_line + 1):
        node = tree.get_node_at_line(line)
        if node is not None:
            out.append(str(node.label))
    return out


def step_status(ctx: AppContext, project_id: uuid.UUID, key: str) -> StepStatus:
    return {s.step_key: s.status for s in ctx.workflows.get(project_id).steps}[key]


def test_steps_tree_then_approve_and_retry(ctx: AppContext) -> None:
    project_id = world(ctx)
    app, toasts = make_app(ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "0")
        screen = app.screen
        assert isinstance(screen, ProjectsScreen)
        listed = rows(screen.query_one("#projects", DataTable))
        assert list(listed) == [str(project_id)]
        assert [str(c) for c in listed[str(project_id)][1:4]] == ["photo_story", "u1", "needs_attention"]

        await press(pilot, "enter")
        detail = app.screen
        assert isinstance(detail, ProjectDetailScreen)
        lines = tree_lines(detail)
        assert lines[0].split()[:3] == ["photo_check", "success", "2.0s"] and "cost 1" in lines[0]
        assert lines[2].startswith("image[]  0/2 done")
        assert "failed" in lines[3] and "INPUT_INVALID: crop outside the photo" in lines[3]
        assert "manual_required" in lines[4] and "FACE_CONSISTENCY_LOW: similarity 0.41" in lines[4]
        assert "needs_attention" in status_line(app)

        # a: approve the manual_required shot, with a reason
        detail.highlight("image[1]")
        await press(pilot, "a")
        assert isinstance(app.screen, ConfirmModal)
        await type_text(pilot, "looks like her")
        await press(pilot, "enter")
        assert step_status(ctx, project_id, "image[1]") is StepStatus.SUCCESS
        assert "approved → success" in toasts.text()
        assert "success" in tree_lines(detail)[4]

        # p on a step that did not fail only explains; on the failed one it retries
        detail.highlight("photo_check")
        await press(pilot, "p")
        assert isinstance(app.screen, ProjectDetailScreen) and "only failed or manual_required" in toasts.text()
        detail.highlight("image[0]")
        await press(pilot, "p")
        await type_text(pilot, "crop fixed")
        await press(pilot, "enter")
        assert step_status(ctx, project_id, "image[0]") is StepStatus.PENDING
        assert ctx.workflows.get(project_id).project.status.value == "running"
        assert "pending" in tree_lines(detail)[3]

    drive(app, scenario)
    with ctx.engine.connect() as conn:
        audits = conn.execute(
            sa.select(audit_log.c.command, audit_log.c.actor, audit_log.c.reason).order_by(audit_log.c.created_at)
        ).all()
        item = conn.execute(sa.select(review_items.c.state, review_items.c.decided_by)).one()
    assert [tuple(a) for a in audits] == [
        ("tui projects approve-step", OPERATOR, "looks like her"),
        ("tui projects retry-step", OPERATOR, "crop fixed"),
    ]
    assert tuple(item) == ("APPROVED", OPERATOR)  # the step's review item closed with the approval


def test_readonly_cannot_retry(ctx: AppContext) -> None:
    project_id = world(ctx)
    app, toasts = make_app(ctx, readonly=True)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "0", "enter")
        detail = app.screen
        assert isinstance(detail, ProjectDetailScreen)
        detail.highlight("image[0]")
        await press(pilot, "p", "a")
        assert app.screen is detail

    drive(app, scenario)
    assert step_status(ctx, project_id, "image[0]") is StepStatus.FAILED
