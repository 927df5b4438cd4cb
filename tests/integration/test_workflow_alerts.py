"""System B alerts and in /metrics, on SQLite and PostgreSQL: failed steps over the threshold,
a workflow queue's backlog, the composition failure rate and a project costing far more than its estimate, each
raised once by the evaluator; projects by status, open steps by queue and status, and each workflow queue's due
depth and age as gauges. Steps are driven through WorkflowService as a worker would report them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts as alerts_table
from aivedio_engine.domain.status import AlertStatus
from aivedio_engine.domain.workflow import ErrorCode
from aivedio_engine.observability.alert_rules import AlertEvaluator
from aivedio_engine.observability.metrics import build_registry, render
from tests.support.app import FakeClock, make_context, tenant_with_key

ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]
QUIET = {
    "provider_consecutive_failures": 1000,
    "media_min_samples": 2,
    "media_failure_rate": 1.0,
    "cost_min_per_hour": "1000000",
    "min_free_bytes": 0,
    "min_free_ratio": 0,
}


@pytest.fixture(params=["sqlite", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    alerts = {**QUIET, "failed_tasks": 2, "queue_depth": 3, "queue_age_s": 600, "cost_factor": 5}
    context = make_context(tmp_path / "data", url, clock=FakeClock(), alerts=alerts)
    yield context
    context.close()


def new_project(ctx: AppContext, tenant: Any, n: int, estimate: str = "0") -> uuid.UUID:
    project, _ = ctx.workflows.create(
        tenant,
        "photo_story",
        user_ref=f"u{n}",
        input={"photo_asset_id": str(n), "script": "One."},
        cost_estimate=Decimal(estimate),
    )
    return project.id


def run_to_composition(ctx: AppContext) -> None:
    """Every due step succeeds at 2 credits, except composition, which fails (FFMPEG_FAILED, retryable) twice."""
    for _ in range(30):
        claimed = ctx.workflows.claim(ALL_QUEUES, limit=50)
        if not claimed:
            ctx.clock.advance(31)  # type: ignore[attr-defined]  # the composition's 30 s retry delay
            claimed = ctx.workflows.claim(ALL_QUEUES, limit=50)
        for s in claimed:
            if s.step_key == "composition":
                failed = ctx.workflows.report_failure(s.id, ErrorCode.FFMPEG_FAILED, "concat: exit 1")
                if failed.retry_count == 2:
                    return
            else:
                out = {"shots": 1} if s.step_key == "plan" else {"ok": True}
                ctx.workflows.report_success(s.id, output_json=out, cost_actual=Decimal(2))
    raise AssertionError("composition was never run twice")


def open_alerts(ctx: AppContext) -> dict[tuple[str, str], Any]:
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(alerts_table).where(alerts_table.c.status == AlertStatus.OPEN.value)).all()
    return {(r.rule, r.dedup_key): r for r in rows}


def samples(ctx: AppContext) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = render(build_registry(ctx)).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("aivedio_projects", "aivedio_workflow"))
    }


def test_workflow_alerts_and_gauges(ctx: AppContext) -> None:
    tenant = tenant_with_key(ctx, "acme").tenant_id
    costly = new_project(ctx, tenant, 0, estimate="1")
    run_to_composition(ctx)
    evaluator = AlertEvaluator(ctx.engine, ctx.clock, ctx.settings, lambda: ctx.liveness)
    fired = {(f.rule.value, f.dedup_key) for f in evaluator.evaluate_now()}
    assert fired == {("composition_failure_rate", "composition"), ("cost_anomaly", f"project:{costly}")}

    for n in (1, 2):  # two photos refused for good: the failed-steps threshold
        new_project(ctx, tenant, n)
        (step,) = ctx.workflows.claim(["photo_check"])
        ctx.workflows.report_failure(step.id, ErrorCode.PHOTO_QUALITY_FAIL, "too dark")
    for n in (3, 4, 5):  # three waiting photo checks: the photo_check queue's depth threshold
        new_project(ctx, tenant, n)
    ctx.clock.advance(10)  # type: ignore[attr-defined]
    evaluator.evaluate_now()
    alerts = open_alerts(ctx)
    assert set(alerts) == {
        ("composition_failure_rate", "composition"),
        ("cost_anomaly", f"project:{costly}"),
        ("failed_steps_high", "all"),
        ("queue_backlog", "workflow:photo_check"),
    }
    assert "2 of 2 composition runs failed" in alerts[("composition_failure_rate", "composition")].message
    assert "over 5 × its estimate of 1" in alerts[("cost_anomaly", f"project:{costly}")].message
    assert alerts[("failed_steps_high", "all")].message.startswith("2 workflow steps failed")
    assert alerts[("queue_backlog", "workflow:photo_check")].message.startswith(
        "workflow queue photo_check: 3 steps due, the oldest for 10 s"
    )
    # evaluated again: the same four alerts, seen again, none added
    evaluator.evaluate_now()
    assert {k: r.id for k, r in open_alerts(ctx).items()} == {k: r.id for k, r in alerts.items()}

    got = samples(ctx)

    def gauge(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert (gauge("aivedio_projects", status="running"), gauge("aivedio_projects", status="failed")) == (1, 2)
    assert gauge("aivedio_projects", status="created") == 3
    assert gauge("aivedio_workflow_steps", queue="photo_check", status="pending") == 3
    assert gauge("aivedio_workflow_steps", queue="photo_check", status="failed") == 2
    assert gauge("aivedio_workflow_steps", queue="ffmpeg", status="retrying") == 1
    assert gauge("aivedio_workflow_queue_due", queue="photo_check") == 3
    assert gauge("aivedio_workflow_queue_age_seconds", queue="photo_check") == 10
    assert ("aivedio_workflow_queue_due", frozenset({("queue", "ffmpeg")})) not in got  # retrying, not due yet


def test_cost_anomaly_fires_on_an_estimate_made_at_creation(ctx: AppContext) -> None:
    """No estimate given: the project estimates itself (its one 1 s clip at 0.5 credits/s). A clip that cost what
    it was estimated at raises nothing; one that cost more than `cost_factor` (5) × the estimate raises the alert."""
    tenant = tenant_with_key(ctx, "acme").tenant_id
    ids = {}
    for n, label in enumerate(("as_estimated", "overrun")):
        project, _ = ctx.workflows.create(
            tenant, "photo_story", user_ref=f"u{n}", input={"photo_asset_id": str(n), "script": "One."}
        )
        assert project.cost_estimate == Decimal("0.5")
        ids[project.id] = label
    clip_cost = {"as_estimated": Decimal("0.5"), "overrun": Decimal("2.51")}  # 2.51 > 5 × 0.5
    for _ in range(10):
        for s in ctx.workflows.claim(ALL_QUEUES, limit=50):
            out = {"shots": 1} if s.step_key == "plan" else {"ok": True}
            cost = clip_cost[ids[s.project_id]] if s.step_key == "clip[0]" else Decimal(0)
            ctx.workflows.report_success(s.id, output_json=out, cost_actual=cost)
    assert all(ctx.workflows.get(pid).project.status.value == "succeeded" for pid in ids)
    overrun = next(pid for pid, label in ids.items() if label == "overrun")
    fired = AlertEvaluator(ctx.engine, ctx.clock, ctx.settings, lambda: ctx.liveness).evaluate_now()
    assert {(f.rule.value, f.dedup_key) for f in fired} == {("cost_anomaly", f"project:{overrun}")}
    alert = open_alerts(ctx)[("cost_anomaly", f"project:{overrun}")]
    assert "its steps cost 2.51 credits, over 5 × its estimate of 0.5" in alert.message
