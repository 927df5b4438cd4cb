"""System B step queues on a real embedded engine (SQLite, in-process broker, relay + worker roles):

- an idle worker makes no query of the step table (no poll loop: idle queues are consumers waiting on the broker);
- a due step runs from its queue's message, and a worker only takes the queues it is given;
- a lost message is recovered by the sweeper finding the step still due;
- queue isolation: a flood of real_video_clip steps (capped, their executor blocked) does not hold image steps;
  the same on PostgreSQL + RabbitMQ, with the idle check there too.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
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
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.project import StepDef, WorkflowDef
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.domain.workflow import QueueName, StepStatus
from aivedio_engine.domain.workflow import StepType as T
from aivedio_engine.services.tenants import Principal
from aivedio_engine.worker.runtime import Runtime
from aivedio_engine.workflows import catalog, executors
from aivedio_engine.workflows.executors import Done, Run
from tests.chaos.support import MutableClock, wait_until
from tests.support.rabbitmq import private_amqp_url

PHOTO = Path(__file__).resolve().parents[2] / "examples" / "photo_story" / "photo.png"
needs_ffmpeg = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


@pytest.fixture
def engine_ctx(tmp_path: Path) -> Iterator[tuple[AppContext, Principal]]:
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}))
    principal = embedded.prepare(ctx)
    yield ctx, principal
    ctx.close()


def _photo_project(ctx: AppContext, principal: Principal) -> uuid.UUID:
    photo = EmbeddedClient(ctx, principal).upload(PHOTO)
    project, _ = ctx.workflows.create(
        principal.tenant_id, "photo_story", user_ref="u1", input={"photo": photo, "script": "Hello there."}
    )
    return project.id


def _step(ctx: AppContext, project_id: uuid.UUID, key: str) -> Any:
    return next((s for s in ctx.workflows.get(project_id).steps if s.step_key == key), None)


def _start(ctx: AppContext, queues: set[str] | None) -> Runtime:
    runtime = Runtime(ctx, {"relay", "worker"}, threading.Event(), queues=queues)
    runtime.start()
    assert runtime.relays[0].ready.wait(10)
    return runtime


class StepQueries:
    """Counts the SQL statements that read or write the step table, with the thread that sent them."""

    def __init__(self, ctx: AppContext) -> None:
        self.seen: list[str] = []
        self._engine = ctx.engine
        sa.event.listen(self._engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "workflow_tasks" in statement:
            self.seen.append(threading.current_thread().name)

    def close(self) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._record)


@needs_ffmpeg
def test_an_idle_worker_makes_no_step_queries_and_a_due_step_runs_from_its_message(
    engine_ctx: tuple[AppContext, Principal],
) -> None:
    ctx, principal = engine_ctx
    runtime = _start(ctx, {"photo_check", "state", "notify"})
    queries = StepQueries(ctx)
    try:
        threading.Event().wait(2.0)  # an idle period: the old runner polled the step table every 0.5 s here
        assert queries.seen == []
        assert not [t for t in threading.enumerate() if t.name == "aivedio-workflows"]

        project_id = _photo_project(ctx, principal)
        check = wait_until(
            lambda: (s := _step(ctx, project_id, "photo_check")) and s.status is StepStatus.SUCCESS and s,
            60,
            "photo_check to run from its message",
        )
        assert check.output_json["width"] == 800
        assert queries.seen  # the counter does see the claim and the reports
        # the plan's message went to the `text` queue, which this worker was not given: it waits there, due
        wait_until(lambda: runtime.broker is not None and runtime.broker.queues["text"].qsize() == 1, 10, "text msg")
        assert _step(ctx, project_id, "plan").status is StepStatus.PENDING

        def targets() -> dict[str, str]:
            with ctx.engine.connect() as conn:
                return {
                    r.target: r.status
                    for r in conn.execute(sa.select(outbox_events.c.target, outbox_events.c.status)).all()
                    if r.target.startswith("run_step_")
                }

        # the relay enqueues inside its transaction and the row reads PUBLISHED once that commits: the message can
        # be seen in the queue a moment before (a CI run read PENDING right after the queue showed it)
        expected = {"run_step_photo_check": "PUBLISHED", "run_step_text": "PUBLISHED"}
        wait_until(lambda: targets() == expected, 10, "both step rows PUBLISHED")
    finally:
        queries.close()
        runtime.shutdown()


@needs_ffmpeg
def test_a_lost_message_is_picked_up_by_the_sweeper(tmp_path: Path) -> None:
    clock = MutableClock(datetime.now(UTC))
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}), clock=clock)
    principal = embedded.prepare(ctx)
    project_id = _photo_project(ctx, principal)
    with ctx.engine.begin() as conn:  # the broker lost it: published, never delivered
        lost = conn.execute(
            sa.update(outbox_events)
            .where(outbox_events.c.target == "run_step_photo_check")
            .values(status=OutboxStatus.PUBLISHED.value, published_at=clock.now())
        ).rowcount
    assert lost == 1
    runtime = _start(ctx, None)
    try:
        assert ctx.workflows.redrive_stale() == []  # due for less than workflows.redrive_after_s: not yet
        assert _step(ctx, project_id, "photo_check").status is StepStatus.PENDING
        clock.advance(ctx.settings.workflows.redrive_after_s + 1)
        runtime._sweep()  # one pass of the sweeper role
        wait_until(lambda: _step(ctx, project_id, "photo_check").status is StepStatus.SUCCESS, 60, "the redriven step")
    finally:
        runtime.shutdown()


FLOOD = WorkflowDef(
    "flood",
    "eight real-video clips and one image",
    (*(StepDef(f"rvc{i}", T.REAL_VIDEO_CLIP) for i in range(8)), StepDef("img", T.FINAL_IMAGE)),
)


def test_a_flood_of_real_video_clips_does_not_block_image_steps(
    engine_ctx: tuple[AppContext, Principal], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, principal = engine_ctx
    _flood(ctx, principal, monkeypatch)


def test_on_postgresql_and_rabbitmq_idle_queues_cost_no_step_query_and_the_flood_is_isolated(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The distributed pieces: RabbitMQ queues named as the seed names them (a private vhost), PostgreSQL claims
    (advisory lock per capped queue, the project row lock), LISTEN/NOTIFY waking the relay."""
    vhost = private_amqp_url("step-queues")
    url = next(vhost)
    overrides = {"data_dir": str(tmp_path), "database": {"url": pg_url}, "broker": {"kind": "rabbitmq", "url": url}}
    ctx = build_context(load_settings(overrides=overrides))
    try:
        migrate.upgrade(ctx.engine)
        principal = embedded.prepare(ctx)
        _flood(ctx, principal, monkeypatch, idle_s=2.0)
    finally:
        ctx.close()
        next(vhost, None)


def _flood(ctx: AppContext, principal: Principal, monkeypatch: pytest.MonkeyPatch, idle_s: float = 0) -> None:
    release = threading.Event()

    def slow_clip(run: Run) -> Done:  # a vendor clip that takes its time: holds a worker thread while it runs
        assert release.wait(60)
        return Done({"clip": run.step.step_key})

    monkeypatch.setitem(catalog.WORKFLOWS, FLOOD.name, FLOOD)
    monkeypatch.setitem(executors.EXECUTORS, T.REAL_VIDEO_CLIP, slow_clip)
    monkeypatch.setitem(executors.EXECUTORS, T.FINAL_IMAGE, lambda run: Done({"image": True}))
    cap = ctx.settings.workflows.queue_max_running["real_video_clip"]
    assert cap == 2 and ctx.settings.broker.worker_threads > cap
    runtime = _start(ctx, None)
    queries = StepQueries(ctx)
    try:
        assert runtime.broker is not None and runtime.worker is not None
        # one broker queue per step queue, named as the seed names them, each consumed by this worker
        assert {q.value for q in QueueName} <= runtime.broker.get_declared_queues() & set(runtime.worker.consumers)
        if idle_s:
            threading.Event().wait(idle_s)  # idle: every queue consumed, no step due
            assert queries.seen == []
        project, _ = ctx.workflows.create(principal.tenant_id, "flood", user_ref="u1", input={"n": 1})

        def by_status() -> dict[str, list[StepStatus]]:
            found: dict[str, list[StepStatus]] = {}
            for s in ctx.workflows.get(project.id).steps:
                found.setdefault(s.task_type.value, []).append(s.status)
            return found

        def image_done_clips_capped() -> bool:
            found = by_status()
            return (
                found["final_image"] == [StepStatus.SUCCESS]
                and found["real_video_clip"].count(StepStatus.RUNNING) == cap
            )

        wait_until(image_done_clips_capped, 30, "the image step done while two clips hold their workers")
        assert by_status()["real_video_clip"].count(StepStatus.PENDING) == 8 - cap  # the rest wait, due
        release.set()  # each clip that ends wakes its queue for the next
        wait_until(lambda: by_status()["real_video_clip"] == [StepStatus.SUCCESS] * 8, 60, "every clip, two at a time")
    finally:
        release.set()
        queries.close()
        runtime.shutdown()
