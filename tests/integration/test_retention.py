"""Retention (issue 16 item 4): per-tenant retention of outputs, inputs and prompts on data made by
real work (sim provider, fetch, media) on both databases and both stores; the engine's bookkeeping deleted by age
and nothing recovery needs; a dead letter older than the inbox retention refused by `replay dlq`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import assets, generation_tasks, projects, workflow_tasks
from aivedio_engine.services.invariants import InvariantService
from aivedio_engine.services.operations import Operation
from aivedio_engine.storage import keys
from tests.integration.test_storage_scan import clip, fresh_bucket  # noqa: F401 - fixture
from tests.integration.test_tenant_purge import generate, upload
from tests.support.app import tenant_with_key
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle

DAY = 86_400
INTERVAL = 30 * DAY


@pytest.fixture(params=["sqlite-fs", "postgres-s3"])
def world(request: pytest.FixtureRequest, tmp_path: Path, sim: SimHandle) -> Iterator[AppContext]:
    db, store = request.param.split("-")
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    # the driver's sweeps run retention when due; once a month here, so the test decides when it runs
    overrides: dict[str, Any] = {"retention": {"interval_s": INTERVAL}}
    if store == "s3":
        overrides["storage"] = fresh_bucket(request.getfixturevalue("moto_s3"))
    ctx = sim_context(tmp_path, sim, url, **overrides)
    yield ctx
    ctx.close()


def advance(ctx: AppContext, sim: SimHandle, seconds: float) -> None:
    ctx.clock.advance(seconds)  # type: ignore[attr-defined]
    sim.advance(seconds)


def task(ctx: AppContext, task_id: uuid.UUID) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()


def asset_rows(ctx: AppContext, *where: Any) -> dict[uuid.UUID, str]:
    with ctx.engine.connect() as conn:
        return {r.id: r.status for r in conn.execute(sa.select(assets.c.id, assets.c.status).where(*where))}


def outputs_of(ctx: AppContext, task_id: uuid.UUID) -> dict[uuid.UUID, str]:
    """The task's raw outputs and their derivatives: id → status."""
    raws = asset_rows(ctx, assets.c.task_id == task_id, assets.c.kind == "RAW_OUTPUT")
    return {**raws, **asset_rows(ctx, assets.c.parent_asset_id.in_(list(raws)))}


def stored_for(ctx: AppContext, tenant_id: uuid.UUID, *ids: uuid.UUID) -> list[str]:
    """Objects of the tenant whose key names one of these task or asset ids."""
    return [o.key for o in ctx.storage.iter_objects(keys.tenant_prefix(tenant_id)) if any(str(i) in o.key for i in ids)]


def test_each_kind_of_tenant_data_goes_exactly_when_past_its_age(
    world: AppContext, sim: SimHandle, clip: bytes
) -> None:
    ctx = world
    acme, other = tenant_with_key(ctx, "acme"), tenant_with_key(ctx, "other")
    op = Operation("tenants update", "contract", dry_run=False)
    days = {"retention_outputs_days": 2, "retention_inputs_days": 3, "retention_prompts_days": 1}
    ctx.tenants.update_limits(acme.tenant_id, days, op)
    driver = Driver(ctx, sim, Pump(ctx))
    done = lambda: driver.all_in("SUCCEEDED", "CANCELED")  # noqa: E731

    reference = upload(ctx, acme.key, clip, len(clip))
    old = generate(ctx, acme.tenant_id, "old", "the old prompt", [reference])
    theirs = generate(ctx, other.tenant_id, "theirs", "their prompt")  # [retention] defaults: kept forever
    driver.run_until(done, max_rounds=60)
    advance(ctx, sim, DAY + 600)
    new = generate(ctx, acme.tenant_id, "new", "the new prompt")
    driver.run_until(done, max_rounds=60)
    old_outputs, new_outputs = outputs_of(ctx, old), outputs_of(ctx, new)
    assert old_outputs and new_outputs and stored_for(ctx, acme.tenant_id, old, *old_outputs)

    # day 1: only the old task's prompt is past its age
    report = ctx.retention.enforce()
    assert (report.prompts, report.outputs, report.inputs) == (1, 0, 0)
    assert (task(ctx, old).prompt, task(ctx, new).prompt) == ("[redacted]", "the new prompt")
    assert task(ctx, old).params["prompt"] == "[redacted]" and task(ctx, old).prompt_redacted_at is not None

    # day 2: the old task's outputs (raw and derivatives), rows first, then their objects; the new one's stay
    advance(ctx, sim, DAY)
    report = ctx.retention.enforce()
    assert (report.outputs, report.prompts, report.objects_failed) == (1, 1, 0)
    assert set(outputs_of(ctx, old).values()) == {"DELETED"}
    assert stored_for(ctx, acme.tenant_id, old, *old_outputs) == []
    assert set(outputs_of(ctx, new).values()) == {"READY"} and stored_for(ctx, acme.tenant_id, *new_outputs)
    assert task(ctx, new).prompt == "[redacted]" and task(ctx, old).status == "SUCCEEDED"

    # day 3: the input, but not while an unfinished task names it
    advance(ctx, sim, DAY)
    waiting = generate(ctx, acme.tenant_id, "waiting", "uses the input", [reference])
    assert ctx.retention.enforce().inputs == 0
    assert asset_rows(ctx, assets.c.id == uuid.UUID(reference)) == {uuid.UUID(reference): "READY"}
    ctx.generations.cancel(acme.tenant_id, waiting)
    driver.run_until(done, max_rounds=20)
    assert ctx.retention.enforce().inputs == 1
    assert asset_rows(ctx, assets.c.id == uuid.UUID(reference)) == {uuid.UUID(reference): "DELETED"}
    assert stored_for(ctx, acme.tenant_id, uuid.UUID(reference)) == []

    # the other tenant has the defaults (0: forever): untouched after all that
    assert task(ctx, theirs).prompt == "their prompt"
    assert set(outputs_of(ctx, theirs).values()) == {"READY"}
    assert stored_for(ctx, other.tenant_id, theirs, *outputs_of(ctx, theirs))
    audit = InvariantService(ctx.engine, ctx.clock).run(only=["I9.1", "I5.4", "I8.3"])
    assert [(c.id, c.rows) for c in audit.results if not c.ok] == []
    last = ctx.retention.enforce()  # nothing left to do
    assert (last.outputs, last.inputs, last.prompts, last.objects_deleted) == (0, 0, 0, 0)


def test_deleted_assets_leftover_bytes_are_orphans_and_retention_runs_from_the_sweeper(
    world: AppContext, sim: SimHandle
) -> None:
    """A crash between marking and deleting leaves bytes no live row names: the orphan scan counts them."""
    ctx = world
    acme = tenant_with_key(ctx, "acme")
    ctx.tenants.update_limits(acme.tenant_id, {"retention_outputs_days": 1}, Operation("u", "r", dry_run=False))
    driver = Driver(ctx, sim, Pump(ctx))
    t = generate(ctx, acme.tenant_id, "t", "a prompt")
    driver.run_until(lambda: driver.all_in("SUCCEEDED"), max_rounds=60)
    outputs = outputs_of(ctx, t)
    kept = stored_for(ctx, acme.tenant_id, t, *outputs)
    with ctx.engine.begin() as conn:  # what a crash right after the marking transaction leaves
        conn.execute(assets.update().where(assets.c.id.in_(list(outputs))).values(status="DELETED"))
    advance(ctx, sim, 2 * 3600)
    scan = ctx.storage_scanner.scan()
    assert sorted(o.key for o in scan.orphan_objects) == sorted(kept)

    # a System B project still running needs the clip for its later steps: kept while it runs
    now, pid = ctx.clock.now(), new_id()
    with ctx.engine.begin() as conn:
        conn.execute(assets.update().where(assets.c.id.in_(list(outputs))).values(status="READY"))
        conn.execute(
            projects.insert().values(
                id=pid, tenant_id=acme.tenant_id, workflow="photo_story", user_ref="u", input={},
                input_hash="0" * 64, status="running", created_at=now, updated_at=now,
            )
        )  # fmt: skip
        conn.execute(
            workflow_tasks.insert().values(
                id=new_id(), project_id=pid, step_key="clip", task_type="video_clip", queue="video", priority=3,
                input_json={}, input_hash="0" * 64, generation_task_id=t, created_at=now, updated_at=now,
            )
        )  # fmt: skip
    advance(ctx, sim, INTERVAL)
    assert ctx.retention.enforce().outputs == 0
    with ctx.engine.begin() as conn:
        conn.execute(projects.update().where(projects.c.id == pid).values(status="succeeded"))
    report = ctx.sweeper.sweep().retention  # due: the driver's first sweep ran it an interval ago
    assert report["outputs"] == 1 and report["objects_deleted"] == len(kept)
    assert ctx.sweeper.sweep().retention == {}  # not due again until retention.interval_s passed
    assert stored_for(ctx, acme.tenant_id, t, *outputs) == []
