"""WorkflowService on both dialects: idempotent projects, the DAG run step by step, the retry schedule on a fake
clock, the project lock, the per-user formal limit, timeouts and cancel."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db import workflows as repo
from aivedio_engine.domain.project import ProjectStatus
from aivedio_engine.domain.workflow import ErrorCode, Priority, StepStatus
from aivedio_engine.services.errors import IdempotencyKeyReused, IllegalState
from aivedio_engine.services.workflows import UserBusy, WorkflowService
from tests.chaos.support import MutableClock, insert_tenant

ALL_QUEUES = ["photo_check", "text", "image", "video", "voice", "audio", "ffmpeg", "qc", "notification"]
INPUT = {"photo": "asset-1", "script": "One. Two."}


@pytest.fixture(params=["sqlite", "postgresql"])
def ctx(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[AppContext]:
    if request.param == "postgresql":
        overrides: dict[str, Any] = {"database": {"url": request.getfixturevalue("pg_url")}}
    else:
        overrides = {"data_dir": str(tmp_path)}
    context = build_context(load_settings(overrides=overrides), clock=MutableClock())
    migrate.upgrade(context.engine)
    yield context
    context.close()


@pytest.fixture
def tenant(ctx: AppContext) -> uuid.UUID:
    with ctx.engine.begin() as conn:
        return insert_tenant(conn)


def statuses(svc: WorkflowService, project_id: uuid.UUID) -> dict[str, StepStatus]:
    return {s.step_key: s.status for s in svc.get(project_id).steps}


def run_one(svc: WorkflowService, queues: list[str] = ALL_QUEUES) -> list[repo.Step]:
    """Claim every due step and report success (the plan says two shots)."""
    claimed = svc.claim(queues, limit=50)
    for s in claimed:
        output = {"shots": 2} if s.step_key == "plan" else {"ok": True}
        svc.report_success(s.id, output_json=output)
    return claimed


def test_project_runs_its_dag_to_succeeded(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    project, created = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, idempotency_key="k1")
    assert created and project.status is ProjectStatus.CREATED
    assert statuses(svc, project.id) == {"photo_check": StepStatus.PENDING}
    waves = []
    for _ in range(20):
        claimed = run_one(svc)
        if not claimed:
            break
        waves.append(sorted(s.step_key for s in claimed))
    assert waves[:3] == [["photo_check"], ["plan"], ["image[0]", "image[1]", "music", "voice"]]
    assert waves[-1] == ["delivery"]
    view = svc.get(project.id)
    assert view.project.status is ProjectStatus.SUCCEEDED and view.project.shots == 2
    assert len(view.steps) == 14 and all(s.status is StepStatus.SUCCESS for s in view.steps)
    with ctx.engine.connect() as conn:
        events = repo.step_events(conn, project.id)
    assert len(events) == 28  # started + succeeded per step: the history explains every move


def test_same_key_returns_the_project_and_another_input_is_refused(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    first, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, idempotency_key="k1")
    again, created = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, idempotency_key="k1")
    assert (again.id, created) == (first.id, False)
    with pytest.raises(IdempotencyKeyReused):
        svc.create(tenant, "photo_story", user_ref="u1", input={**INPUT, "script": "x"}, idempotency_key="k1")


def test_twenty_concurrent_identical_requests_make_one_project(ctx: AppContext, tenant: uuid.UUID) -> None:
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("concurrency is PostgreSQL's to prove (SQLite serializes writers)")
    svc = ctx.workflows
    ids: list[uuid.UUID] = []
    barrier = threading.Barrier(20)

    def create() -> None:
        barrier.wait()
        project, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, idempotency_key="same")
        ids.append(project.id)

    threads = [threading.Thread(target=create) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 20 and len(set(ids)) == 1
    assert len(svc.list_projects(tenant)) == 1


def test_one_formal_project_per_user(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    svc.create(tenant, "photo_story", user_ref="alice", input=INPUT, formal=True)
    with pytest.raises(UserBusy, match="alice already has an open formal project"):
        svc.create(tenant, "photo_story", user_ref="alice", input={"other": 1}, formal=True)
    svc.create(tenant, "photo_story", user_ref="alice", input={"preview": 1})  # previews are not limited
    svc.create(tenant, "photo_story", user_ref="bob", input=INPUT, formal=True)


def test_retries_wait_30_120_300_s_then_manual_required_and_retry_entry(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc, clock = ctx.workflows, ctx.clock
    assert isinstance(clock, MutableClock)
    project, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT)
    waits = []
    for _ in range(3):
        (step,) = svc.claim(["photo_check"])
        failed = svc.report_failure(step.id, ErrorCode.PROVIDER_TIMEOUT, "slow")
        assert failed.status is StepStatus.RETRYING and failed.next_attempt_at is not None
        waits.append((failed.next_attempt_at - clock.now()).total_seconds())
        clock.advance(waits[-1] - 1)
        assert svc.claim(["photo_check"]) == []  # not due yet
        clock.advance(1)
    assert waits == [30, 120, 300]
    (step,) = svc.claim(["photo_check"])
    final = svc.report_failure(step.id, ErrorCode.PROVIDER_TIMEOUT, "slow again")
    assert (final.status, final.retry_count, final.error_code) == (StepStatus.MANUAL_REQUIRED, 3, "PROVIDER_TIMEOUT")
    assert svc.get(project.id).project.status is ProjectStatus.NEEDS_ATTENTION
    # the retry entry: same row, fresh budget, the project runs again
    again = svc.retry_step(project.id, "photo_check")
    assert (again.id, again.status, again.retry_count) == (step.id, StepStatus.PENDING, 0)
    (step,) = svc.claim(["photo_check"])
    assert svc.get(project.id).project.status is ProjectStatus.RUNNING


def test_non_retryable_error_fails_the_step_and_the_project(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    project, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT)
    (step,) = svc.claim(["photo_check"])
    failed = svc.report_failure(step.id, ErrorCode.PHOTO_QUALITY_FAIL, "too dark")
    assert (failed.status, failed.error_message) == (StepStatus.FAILED, "too dark")
    assert svc.get(project.id).project.status is ProjectStatus.FAILED
    with pytest.raises(IllegalState):
        svc.report_success(step.id)  # a late success report of a failed step changes nothing
    # a premium project's failures go to a person instead
    svc.create(tenant, "photo_story", user_ref="free", input={"n": 1}, priority=Priority.FREE_PREVIEW)
    premium, _ = svc.create(tenant, "photo_story", user_ref="vip", input=INPUT, priority=Priority.PREMIUM)
    (step,) = svc.claim(["photo_check"])
    assert step.project_id == premium.id  # created second, served first: tier 1
    assert svc.report_failure(step.id, ErrorCode.PHOTO_QUALITY_FAIL, "x").status is StepStatus.MANUAL_REQUIRED


def test_project_lock_lets_one_composition_run(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc, clock = ctx.workflows, ctx.clock
    assert isinstance(clock, MutableClock)
    project, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT)
    with ctx.engine.begin() as conn:
        p = repo.project(conn, project.id)
        assert p is not None
        other = uuid.uuid4()  # another lock-holding step (e.g. a plan re-run) holds the lock for 3 minutes
        repo.update_project(conn, p, clock.now(), lock_holder=other, lock_until=clock.now() + timedelta(minutes=3))
    run_one(svc, ["photo_check"])
    assert svc.claim(["text"]) == []  # the plan needs the lock: it waits
    clock.advance(181)  # the holder died: its lease ran out
    (plan,) = svc.claim(["text"])
    assert plan.step_key == "plan"
    held = svc.get(project.id).project
    assert held.lock_holder == plan.id and held.lock_until is not None
    svc.report_success(plan.id, output_json={"shots": 1})
    assert svc.get(project.id).project.lock_holder is None


def test_running_step_past_its_timeout_is_retried(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc, clock = ctx.workflows, ctx.clock
    assert isinstance(clock, MutableClock)
    svc.create(tenant, "photo_story", user_ref="u1", input=INPUT)
    (step,) = svc.claim(["photo_check"])
    clock.advance(119)
    assert svc.sweep_timeouts() == []
    clock.advance(2)
    (moved,) = svc.sweep_timeouts()
    assert (moved.id, moved.status, moved.error_code) == (step.id, StepStatus.RETRYING, "TASK_TIMEOUT")


def test_cancel_closes_open_steps(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    project, _ = svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, formal=True)
    svc.claim(["photo_check"])
    cancelled = svc.cancel(project.id)
    assert cancelled.status is ProjectStatus.CANCELLED and cancelled.finished_at is not None
    assert statuses(svc, project.id) == {"photo_check": StepStatus.CANCELLED}
    assert svc.cancel(project.id).status is ProjectStatus.CANCELLED  # repeating is harmless
    svc.create(tenant, "photo_story", user_ref="u1", input=INPUT, formal=True)  # the user's slot is free again
    assert Decimal(0) == cancelled.cost_actual
