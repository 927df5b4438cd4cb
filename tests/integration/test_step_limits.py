"""Step limits enforced when a step is claimed, on both dialects: N image steps per project, one
composition per project, a cap of its own on real_video_clip (across projects), the provider's step rate, and a
wake-up of what waited once the step holding it back stops running."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.project import StepDef, WorkflowDef
from aivedio_engine.domain.ratelimit import Rate
from aivedio_engine.domain.step_limits import StepLimits
from aivedio_engine.domain.workflow import ErrorCode, Priority, StepStatus
from aivedio_engine.domain.workflow import StepType as T
from aivedio_engine.ratelimit.memory import MemoryBucketStore
from aivedio_engine.services.workflows import WorkflowService
from aivedio_engine.workflows import catalog
from tests.chaos.support import MutableClock, insert_tenant

FLOOD = WorkflowDef(
    "flood",
    "six real-video clips and two images, no dependencies",
    (
        *(StepDef(f"rvc{i}", T.REAL_VIDEO_CLIP) for i in range(6)),
        StepDef("img0", T.FINAL_IMAGE),
        StepDef("img1", T.FINAL_IMAGE),
    ),
)
IMAGES = WorkflowDef("images", "four images at once", tuple(StepDef(f"img{i}", T.FINAL_IMAGE) for i in range(4)))
TWO_CUTS = WorkflowDef(
    "two_cuts", "two compositions", (StepDef("cut_a", T.COMPOSITION), StepDef("cut_b", T.COMPOSITION))
)


@pytest.fixture(params=["sqlite", "postgresql"])
def ctx(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    for wf in (FLOOD, IMAGES, TWO_CUTS):
        monkeypatch.setitem(catalog.WORKFLOWS, wf.name, wf)
    overrides: dict[str, Any] = {
        "workflows": {"project_max_image_steps": 2, "queue_max_running": {"real_video_clip": 2}},
        "data_dir": str(tmp_path),
    }
    if request.param == "postgresql":
        overrides["database"] = {"url": request.getfixturevalue("pg_url")}
    context = build_context(load_settings(overrides=overrides), clock=MutableClock())
    migrate.upgrade(context.engine)
    yield context
    context.close()


@pytest.fixture
def tenant(ctx: AppContext) -> uuid.UUID:
    with ctx.engine.begin() as conn:
        return insert_tenant(conn)


def wakeups(ctx: AppContext, actor: str) -> int:
    with ctx.engine.connect() as conn:
        stmt = sa.select(sa.func.count()).where(outbox_events.c.target == actor)
        return int(conn.execute(stmt).scalar_one())


def test_two_image_steps_beyond_n_wait_and_are_woken(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    project, _ = svc.create(tenant, "images", user_ref="u1", input={"n": 1})
    assert wakeups(ctx, "run_step_image") == 4  # each step announced on its queue when it became due
    first = svc.claim(["image"], limit=10)
    assert len(first) == 2  # N = 2 per project
    assert svc.claim(["image"], limit=10) == []  # the other two wait, still due
    other, _ = svc.create(tenant, "images", user_ref="u2", input={"n": 2})
    assert {s.project_id for s in svc.claim(["image"], limit=10)} == {other.id}  # per project, not global

    svc.report_success(first[0].id, output_json={"ok": True})
    assert wakeups(ctx, "run_step_image") == 4 + 4 + 1  # one stopped: its project's image queue is woken
    (third,) = svc.claim(["image"], limit=10)
    assert third.project_id == project.id
    assert svc.claim(["image"], limit=10) == []


def test_a_second_composition_of_a_project_waits(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    project, _ = svc.create(tenant, "two_cuts", user_ref="u1", input={"n": 1})
    (cut,) = svc.claim(["ffmpeg"], limit=10)
    assert svc.claim(["ffmpeg"], limit=10) == []
    other, _ = svc.create(tenant, "two_cuts", user_ref="u2", input={"n": 2})
    (elsewhere,) = svc.claim(["ffmpeg"], limit=10)  # another project composes meanwhile
    assert elsewhere.project_id == other.id
    svc.report_success(cut.id, output_json={"ok": True})
    (second,) = svc.claim(["ffmpeg"], limit=10)
    assert second.project_id == project.id and second.step_key != cut.step_key


def test_real_video_clip_has_its_own_cap_and_does_not_hold_images(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    a, _ = svc.create(tenant, "flood", user_ref="u1", input={"n": 1})
    b, _ = svc.create(tenant, "flood", user_ref="u2", input={"n": 2})
    running = svc.claim(["real_video_clip"], limit=20)
    assert len(running) == 2  # across both projects: the queue's own cap
    assert svc.claim(["real_video_clip"], limit=20) == []
    assert len(svc.claim(["image"], limit=20)) == 4  # ten clips waiting hold no image back
    svc.report_failure(running[0].id, ErrorCode.PROVIDER_ERROR, "vendor 500")  # retrying: a slot frees
    (next_clip,) = svc.claim(["real_video_clip"], limit=20)
    assert next_clip.id != running[0].id
    statuses = [s.status for p in (a, b) for s in svc.get(p.id).steps if s.task_type is T.REAL_VIDEO_CLIP]
    assert statuses.count(StepStatus.RUNNING) == 2 and statuses.count(StepStatus.PENDING) == 9


def test_concurrent_claimers_never_exceed_the_queue_cap(ctx: AppContext, tenant: uuid.UUID) -> None:
    if ctx.engine.dialect.name != "postgresql":
        pytest.skip("concurrency is PostgreSQL's to prove (SQLite serializes writers)")
    svc = ctx.workflows
    for i in range(8):  # 48 due clips: every claimer finds some no other claimer holds
        svc.create(tenant, "flood", user_ref=f"u{i}", input={"n": i})
    barrier = threading.Barrier(8)
    started: list[Any] = []
    lock = threading.Lock()

    def claimer() -> None:
        barrier.wait()
        got = svc.claim(["real_video_clip"], limit=1)
        with lock:
            started.extend(got)

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(started) == 2


def test_vendor_steps_start_at_their_providers_rate(ctx: AppContext, tenant: uuid.UUID) -> None:
    clock = ctx.clock
    assert isinstance(clock, MutableClock)
    limits = StepLimits(vendor_provider="local", provider_rate={"local": Rate(per_s=1, burst=1)})
    svc = WorkflowService(ctx.engine, clock, None, limits, 60, MemoryBucketStore())
    svc.create(tenant, "flood", user_ref="u1", input={"n": 1})
    before = wakeups(ctx, "run_step_real_video_clip")
    assert len(svc.claim(["real_video_clip"], limit=10)) == 1  # one token in the bucket
    assert svc.claim(["real_video_clip"], limit=10) == []
    with ctx.engine.connect() as conn:
        (due_at,) = conn.execute(
            sa.select(outbox_events.c.available_at)
            .where(outbox_events.c.target == "run_step_real_video_clip")
            .order_by(outbox_events.c.created_at.desc(), outbox_events.c.available_at.desc())
            .limit(1)
        ).one()
    # the refused clips' queue is woken when the next token is there (one wake-up per refusing claim)
    assert wakeups(ctx, "run_step_real_video_clip") == before + 2
    assert due_at.replace(tzinfo=None) == (clock.now() + timedelta(seconds=1)).replace(tzinfo=None)
    assert len(svc.claim(["image"], limit=10)) == 2  # local steps take no token
    clock.advance(1)
    assert len(svc.claim(["real_video_clip"], limit=10)) == 1


def test_a_wake_up_claims_the_best_priority_not_the_step_it_names(ctx: AppContext, tenant: uuid.UUID) -> None:
    svc = ctx.workflows
    free, _ = svc.create(tenant, "images", user_ref="f", input={"n": 1}, priority=Priority.FREE_PREVIEW)
    premium, _ = svc.create(tenant, "images", user_ref="p", input={"n": 2}, priority=Priority.PREMIUM)
    with ctx.engine.connect() as conn:  # the broker holds the free previews' wake-ups first (FIFO)
        first = conn.execute(
            sa.select(outbox_events.c.payload)
            .where(outbox_events.c.target == "run_step_image")
            .order_by(outbox_events.c.id)  # the relay's order
            .limit(1)
        ).scalar_one()
    assert first["project_id"] == str(free.id)
    (step,) = svc.claim(["image"], limit=1)  # what the actor does with that first message
    assert step.project_id == premium.id and step.priority == Priority.PREMIUM


def test_a_project_with_many_waiting_images_does_not_hide_another_projects(
    ctx: AppContext, tenant: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty premium images wait behind their project's limit; a free preview's one image still starts (the
    claim does not stop at the first page of candidates it may not start)."""
    many = WorkflowDef("many", "twenty images", tuple(StepDef(f"img{i}", T.FINAL_IMAGE) for i in range(20)))
    monkeypatch.setitem(catalog.WORKFLOWS, many.name, many)
    svc = ctx.workflows
    big, _ = svc.create(tenant, "many", user_ref="a", input={"n": 1}, priority=Priority.PREMIUM)
    small, _ = svc.create(tenant, "images", user_ref="b", input={"n": 2}, priority=Priority.FREE_PREVIEW)
    claimed = [svc.claim(["image"], limit=1) for _ in range(4)]
    assert [[s.project_id for s in c] for c in claimed] == [[big.id], [big.id], [small.id], [small.id]]
