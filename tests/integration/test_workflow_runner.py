"""The System B runner on a real embedded engine (SQLite, in-process broker, the `local` provider, real ffmpeg).

- a real-video step whose generation task fails: the step fails with the provider's error and is scheduled for
  its retry (record the provider error, mark the clip failed/needs-retry, never a fake success,
  never charge twice);
- a worker that died mid-step (it claimed the step and never reported, as after kill -9): the sweeper's timeout
  scan fails it with TASK_TIMEOUT, and after the 30 s retry delay the next runner does the work.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine import embedded
from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.client import EmbeddedClient
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.tables import credit_ledger, generation_tasks, workflow_task_events
from aivedio_engine.domain.workflow import STEP_SPECS, ErrorCode, StepStatus, StepType
from aivedio_engine.services.tenants import Principal
from aivedio_engine.worker.runtime import Runtime
from aivedio_engine.workflows.runner import WorkflowRunner
from tests.chaos.support import MutableClock

PHOTO = Path(__file__).resolve().parents[2] / "examples" / "photo_story" / "photo.png"

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


def _ctx(tmp_path: Path, clock: Any = None) -> AppContext:
    settings = load_settings(overrides={"data_dir": str(tmp_path)})
    return build_context(settings, clock=clock) if clock is not None else build_context(settings)


def _wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _project(ctx: AppContext, principal: Principal, script: str) -> uuid.UUID:
    photo = EmbeddedClient(ctx, principal).upload(PHOTO)
    project, _ = ctx.workflows.create(
        principal.tenant_id, "photo_story", user_ref="u1", input={"photo": photo, "script": script}
    )
    return project.id


@pytest.fixture
def engine_ctx(tmp_path: Path) -> Iterator[tuple[AppContext, Principal]]:
    ctx = _ctx(tmp_path)
    principal = embedded.prepare(ctx)
    yield ctx, principal
    ctx.close()


def test_failed_clip_generation_fails_the_step_with_its_provider_error(
    engine_ctx: tuple[AppContext, Principal], tmp_path: Path
) -> None:
    ctx, principal = engine_ctx
    # the provider's renderer is broken (its ffmpeg exits 1); the workflow's own ffmpeg steps are not
    broken = tmp_path / "broken-ffmpeg"
    broken.write_text("#!/bin/sh\necho 'render exploded' >&2\nexit 1\n")
    broken.chmod(0o755)
    provider: Any = ctx.providers["local"]
    provider._ffmpeg = str(broken)

    project_id = _project(ctx, principal, "Hello there.")
    runtime = Runtime(ctx, embedded.BACKGROUND_ROLES, threading.Event())
    runtime.start()
    try:

        def clip_done() -> Any:
            steps = {s.step_key: s for s in ctx.workflows.get(project_id).steps}
            clip = steps.get("clip[0]")
            return clip if clip is not None and clip.status in (StepStatus.RETRYING, StepStatus.FAILED) else None

        clip = _wait_for(clip_done, 120, "clip[0] to fail")
    finally:
        runtime.shutdown()

    # the provider's error, recorded on the step, with the task it came from
    assert clip.status is StepStatus.RETRYING
    assert clip.error_code == ErrorCode.PROVIDER_ERROR  # the provider ran the job and reported it failed
    assert clip.generation_task_id is not None
    assert str(clip.generation_task_id) in (clip.error_message or "")
    assert clip.retry_count == 1
    assert clip.next_attempt_at is not None and clip.started_at is not None
    # the first retry 30 s after the failure (which came within a minute of the start)
    assert 30 <= (clip.next_attempt_at - clip.started_at).total_seconds() <= 90
    view = ctx.workflows.get(project_id)
    # never a fake success: nothing after the clip ran, the project has no result
    assert "composition" not in {s.step_key for s in view.steps}
    assert view.project.result_asset_id is None and view.project.status.value == "running"
    with ctx.engine.connect() as conn:
        task = conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == clip.generation_task_id)).one()
        assert task.status == "FAILED_FINAL"
        entries = [
            r.entry_type
            for r in conn.execute(
                sa.select(credit_ledger.c.entry_type).where(credit_ledger.c.task_id == clip.generation_task_id)
            )
        ]
        events = [
            (r.event, r.error_code)
            for r in conn.execute(
                sa.select(workflow_task_events)
                .where(workflow_task_events.c.workflow_task_id == clip.id)
                .order_by(workflow_task_events.c.created_at)
            )
        ]
    # what the failed try cost (the engine's billing rule) is the step's and the project's actual cost
    assert clip.cost_actual == task.actual_cost == view.project.cost_actual
    assert entries.count("RESERVE") == 1, entries
    # closed once, by the generation engine's billing rule (an accepted job that failed is billed as vendors do);
    # the step's failure adds no booking of its own
    assert entries.count("SETTLE") + entries.count("RELEASE") == 1, entries
    # the retry entry: the step's history says it is scheduled again, with the provider's error
    assert events[-1] == ("retry_scheduled", clip.error_code)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_worker_killed_mid_step_is_recovered_by_the_timeout_sweep(
    tmp_path: Path, dialect: str, request: pytest.FixtureRequest
) -> None:
    clock = MutableClock()
    overrides: dict[str, Any] = {"data_dir": str(tmp_path)}
    if dialect == "postgresql":
        overrides["database"] = {"url": request.getfixturevalue("pg_url")}
    ctx = build_context(load_settings(overrides=overrides), clock=clock)
    try:
        migrate.upgrade(ctx.engine)
        principal = embedded.prepare(ctx)
        project_id = _project(ctx, principal, "Hello there.")
        # a worker claims photo_check and dies (kill -9): no report ever comes
        (dead,) = ctx.workflows.claim(["photo_check"])
        assert dead.status is StepStatus.RUNNING
        runner = WorkflowRunner(ctx)
        assert runner.run_once() == 0  # nothing else is due: the plan waits for the photo check
        assert ctx.workflows.sweep_timeouts() == []  # not late yet

        clock.advance(STEP_SPECS[StepType.PHOTO_CHECK].timeout_s + 1)
        (late,) = ctx.workflows.sweep_timeouts()
        assert late.status is StepStatus.RETRYING and late.error_code == ErrorCode.TASK_TIMEOUT
        assert late.retry_count == 1
        assert runner.run_once() == 0  # the retry waits its 30 s

        clock.advance(30)
        assert runner.run_once() >= 1
        steps = {s.step_key: s for s in ctx.workflows.get(project_id).steps}
        assert steps["photo_check"].status is StepStatus.SUCCESS
        assert steps["photo_check"].output_json and steps["photo_check"].output_json["width"] == 800
        assert steps["plan"].status in (StepStatus.PENDING, StepStatus.SUCCESS)
    finally:
        ctx.close()


def test_worker_process_killed_mid_step_then_swept_and_rerun(tmp_path: Path) -> None:
    """A real `aivedio serve --role relay,worker` (embedded: the in-process broker needs both) takes photo_check
    from its queue and is SIGKILLed right there (a failpoint); the step stays running with nobody working on it,
    until the timeout sweep (fake clock past 2 min) schedules it again and, 30 s later, a runner does it."""
    # the worker process runs on the real clock: the test's own starts there too
    clock = MutableClock(datetime.now(UTC))
    ctx = _ctx(tmp_path, clock)
    try:
        principal = embedded.prepare(ctx)
        project_id = _project(ctx, principal, "Hello there.")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
        env.update(AIVEDIO_FAILPOINTS="workflow.step_claimed=kill", PYTHONUNBUFFERED="1")
        argv = [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={tmp_path}", "serve", "--role", "relay,worker"]
        worker = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            code = worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        assert code == -signal.SIGKILL, worker.stderr.read().decode()[-1000:] if worker.stderr else code
        (step,) = [s for s in ctx.workflows.get(project_id).steps if s.step_key == "photo_check"]
        assert step.status is StepStatus.RUNNING  # claimed by the dead worker

        assert step.started_at is not None
        clock.advance((step.started_at - clock.now()).total_seconds() + STEP_SPECS[StepType.PHOTO_CHECK].timeout_s + 1)
        (late,) = ctx.workflows.sweep_timeouts()
        assert late.id == step.id and late.error_code == ErrorCode.TASK_TIMEOUT
        clock.advance(30)
        assert WorkflowRunner(ctx).run_once() >= 1
        (step,) = [s for s in ctx.workflows.get(project_id).steps if s.step_key == "photo_check"]
        assert step.status is StepStatus.SUCCESS and step.retry_count == 1
    finally:
        ctx.close()


def test_a_worker_subscribes_only_to_the_queues_it_is_given(tmp_path: Path) -> None:
    """`serve --role worker --queues video,ffmpeg`: the Dramatiq worker consumes those two step queues (and their
    delay queues) and nothing else; no other thread looks for System B work."""
    from aivedio_engine.worker import runtime

    assert runtime.parse_queues("state,video") == {"state", "video"}
    ctx = _ctx(tmp_path)
    try:
        for given in ({"video", "ffmpeg"}, {"state"}):
            rt = runtime.Runtime(ctx, {"worker"}, threading.Event(), queues=given)
            rt.start()
            try:
                assert rt.worker is not None
                assert {q.removesuffix(".DQ") for q in rt.worker.consumers} == given
                assert not [t for t in threading.enumerate() if t.name == "aivedio-workflows"]
            finally:
                rt.shutdown()
    finally:
        ctx.close()


def test_a_dark_flat_photo_fails_the_photo_check_for_good(
    engine_ctx: tuple[AppContext, Principal], tmp_path: Path
) -> None:
    ctx, principal = engine_ctx
    dark = tmp_path / "dark.png"  # RGB 8,8,8: limited-range luma 23
    subprocess.run(
        ["ffmpeg", "-v", "error", "-f", "lavfi", "-i", "color=c=0x080808:s=640x480", "-frames:v", "1", str(dark)],
        check=True,
    )
    photo = EmbeddedClient(ctx, principal).upload(dark)
    project, _ = ctx.workflows.create(
        principal.tenant_id, "photo_story", user_ref="u1", input={"photo": photo, "script": "Hi."}
    )
    assert WorkflowRunner(ctx).run_once() == 1
    view = ctx.workflows.get(project.id)
    (check,) = view.steps
    assert check.status is StepStatus.FAILED and check.error_code == ErrorCode.PHOTO_QUALITY_FAIL
    assert "brightness 23 outside" in (check.error_message or "") and "contrast 0" in (check.error_message or "")
    assert view.project.status.value == "failed" and check.retry_count == 0  # not retried: the photo is at fault


def test_an_interrupted_step_is_due_again_at_once_without_using_a_retry(tmp_path: Path) -> None:
    """Ctrl-C or a shutdown stops a step's ffmpeg: the step goes back to the queue now, retry_count unchanged."""
    from aivedio_engine.media import sandbox

    clock = MutableClock()
    ctx = _ctx(tmp_path, clock)
    try:
        principal = embedded.prepare(ctx)
        project_id = _project(ctx, principal, "Hello there.")
        runner = WorkflowRunner(ctx)
        with sandbox.stopping():  # every media child refused, as while the engine shuts down
            assert runner.run_once() == 1
        (step,) = ctx.workflows.get(project_id).steps
        assert step.status is StepStatus.RETRYING and step.retry_count == 0 and step.error_code is None
        assert step.next_attempt_at == clock.now()
        assert runner.run_once() >= 1  # no delay: it runs on the next pass
        assert ctx.workflows.get(project_id).steps[0].status is StepStatus.SUCCESS
    finally:
        ctx.close()
