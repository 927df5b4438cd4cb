"""A System B project's cost on both dialects: estimated when it is created (its clips at the model's price list,
its local steps at `[workflows] local_step_credits`), each step row carrying its share, and a local step's
configured price counted once in the actual cost — on its success, never for a failed try or a second report."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.domain.project import ProjectStatus
from aivedio_engine.domain.workflow import ErrorCode, StepStatus
from aivedio_engine.services.errors import IllegalState
from tests.chaos.support import MutableClock, insert_tenant

ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]
#: two shots of one second each; the local model costs 0.5 credits/s at its first resolution (aivedio.toml)
INPUT = {"photo_asset_id": "asset-1", "script": "One. Two."}
PRICES = {"composition": "2", "final_image": "0.25"}


def _context(request: pytest.FixtureRequest, tmp_path: Any, workflows: dict[str, Any]) -> AppContext:
    if request.param == "postgresql":
        overrides: dict[str, Any] = {"database": {"url": request.getfixturevalue("pg_url")}}
    else:
        overrides = {"data_dir": str(tmp_path)}
    context = build_context(load_settings(overrides={**overrides, "workflows": workflows}), clock=MutableClock())
    migrate.upgrade(context.engine)
    return context


@pytest.fixture(params=["sqlite", "postgresql"])
def free(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[AppContext]:
    context = _context(request, tmp_path, {})
    yield context
    context.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def priced(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[AppContext]:
    context = _context(request, tmp_path, {"local_step_credits": PRICES})
    yield context
    context.close()


def _tenant(ctx: AppContext) -> uuid.UUID:
    with ctx.engine.begin() as conn:
        return insert_tenant(conn)


def run(ctx: AppContext, project_id: uuid.UUID, *, fail_composition_once: bool = False) -> None:
    """Every due step succeeds as a worker would report it: a clip with what its generation settled (its
    estimate), a local step with nothing (the service adds its configured price)."""
    failed = not fail_composition_once
    for _ in range(40):
        claimed = ctx.workflows.claim(ALL_QUEUES, limit=50)
        if not claimed:
            ctx.clock.advance(31)  # type: ignore[attr-defined]  # a retry's 30 s delay
            claimed = ctx.workflows.claim(ALL_QUEUES, limit=50)
            if not claimed:
                break
        for s in claimed:
            if s.step_key == "composition" and not failed:
                failed = True
                ctx.workflows.report_failure(s.id, ErrorCode.FFMPEG_FAILED, "concat: exit 1")
                continue
            out = {"shots": 2} if s.step_key == "plan" else {"ok": True}
            cost = s.cost_estimate if s.step_key.startswith("clip") else Decimal(0)
            ctx.workflows.report_success(s.id, output_json=out, cost_actual=cost)
    assert ctx.workflows.get(project_id).project.status is ProjectStatus.SUCCEEDED


def test_estimate_is_set_up_front_and_equals_what_the_steps_cost(free: AppContext) -> None:
    project, _ = free.workflows.create(_tenant(free), "photo_story", user_ref="u1", input=INPUT)
    assert project.cost_estimate == Decimal("1")  # two 1 s clips × 0.5 credits/s; local steps free by default
    run(free, project.id)
    view = free.workflows.get(project.id)
    steps = {s.step_key: s for s in view.steps}
    assert {k: s.cost_estimate for k, s in steps.items() if s.cost_estimate} == {
        "clip[0]": Decimal("0.5"),
        "clip[1]": Decimal("0.5"),
    }
    assert sum(s.cost_actual for s in view.steps) == view.project.cost_actual == project.cost_estimate


def test_configured_local_prices_are_estimated_and_counted_once(priced: AppContext) -> None:
    svc = priced.workflows
    project, _ = svc.create(_tenant(priced), "photo_story", user_ref="u1", input=INPUT)
    # clips 1 + composition 2 + two images × 0.25
    assert project.cost_estimate == Decimal("3.5")
    run(priced, project.id, fail_composition_once=True)
    view = svc.get(project.id)
    steps = {s.step_key: s for s in view.steps}
    # composition failed once (free) and succeeded on its retry: its price counted once
    assert steps["composition"].retry_count == 1 and steps["composition"].cost_actual == Decimal("2")
    assert steps["image[0]"].cost_actual == steps["image[1]"].cost_actual == Decimal("0.25")
    assert steps["voice"].cost_actual == 0  # not listed: free
    assert view.project.cost_actual == sum(s.cost_actual for s in view.steps) == project.cost_estimate
    # a second success report of the same step (a redelivered message) is refused and adds nothing
    with pytest.raises(IllegalState):
        svc.report_success(steps["composition"].id, output_json={"ok": True})
    assert svc.get(project.id).project.cost_actual == Decimal("3.5")
    assert steps["composition"].status is StepStatus.SUCCESS


def test_an_explicit_estimate_is_kept(free: AppContext) -> None:
    project, _ = free.workflows.create(
        _tenant(free), "photo_story", user_ref="u1", input=INPUT, cost_estimate=Decimal("7")
    )
    assert project.cost_estimate == Decimal("7")
