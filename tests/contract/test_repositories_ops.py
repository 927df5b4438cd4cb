"""The repository contract, continued (see test_repositories.py): assets, client webhook deliveries, process
heartbeats, the `local` provider's jobs, and the workflow steps' claim (FOR UPDATE SKIP LOCKED on PostgreSQL,
the write lock on SQLite), each with the same assertions on both dialects."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import new_id
from aivedio_engine.db import assets, attempts, heartbeats, webhooks
from aivedio_engine.db import workflows as wf
from aivedio_engine.db.local_jobs import LocalJobs
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.db.tables import assets as assets_table
from aivedio_engine.domain.status import AssetKind, AssetStatus, TaskStatus, WebhookDeliveryState
from aivedio_engine.domain.workflow import StepStatus, StepType
from aivedio_engine.providers.base import JobStatus
from tests.chaos.support import T0, insert_tasks, insert_tenant
from tests.contract.conftest import tenant_and_task

# --- assets ---------------------------------------------------------------------------------------------------


def _asset(
    tenant: uuid.UUID, kind: AssetKind, status: AssetStatus = AssetStatus.READY, **values: Any
) -> dict[str, Any]:
    return dict(id=new_id(), tenant_id=tenant, kind=kind.value, status=status.value, bucket="b",
                object_key=str(new_id()), created_at=T0, **values)  # fmt: skip


def test_input_assets_come_back_in_request_order_and_only_the_tenants(engine: Engine) -> None:
    tenant, _ = tenant_and_task(engine)
    mine = _asset(tenant, AssetKind.INPUT_IMAGE, width=640)
    with write_tx(engine) as conn:
        other = insert_tenant(conn)
        other_tenants = _asset(other, AssetKind.INPUT_IMAGE, width=None)
        conn.execute(assets_table.insert(), [mine, other_tenants])
        found = assets.inputs_of(conn, tenant, [str(other_tenants["id"]), str(mine["id"]), str(new_id())])
        assert assets.inputs_of(conn, tenant, []) == []
    assert [f.id if f else None for f in found] == [None, mine["id"], None]
    assert found[1] is not None and (found[1].width, found[1].kind) == (640, AssetKind.INPUT_IMAGE.value)


def test_raw_outputs_list_a_jobs_outputs_with_their_ready_derivatives(engine: Engine) -> None:
    tenant, task = tenant_and_task(engine)
    with write_tx(engine) as conn:
        attempt = attempts.create(conn, task_id=task, attempt_no=1, provider="sim", model="m", params={}, now=T0)
        job = dict(task_id=task, attempt_id=attempt)
        raws = [_asset(tenant, AssetKind.RAW_OUTPUT, output_index=i, **job) for i in (1, 0)]
        conn.execute(assets_table.insert(), raws)
        derived = [
            _asset(tenant, AssetKind.PROXY, parent_asset_id=raws[1]["id"], profile="proxy_mp4", pipeline_version=1),
            _asset(tenant, AssetKind.THUMBNAIL, parent_asset_id=raws[1]["id"], profile="thumbnail", pipeline_version=2),
            _asset(tenant, AssetKind.PROXY, AssetStatus.FAILED, parent_asset_id=raws[0]["id"], profile="proxy_mp4",
                   pipeline_version=1),
        ]  # fmt: skip
        conn.execute(assets_table.insert(), derived)
        outputs = assets.raw_outputs(conn, raws[0]["id"], pipeline_version=1)
    assert [(o.id, o.index, o.ready_profiles) for o in outputs] == [
        (raws[1]["id"], 0, frozenset({"proxy_mp4"})),
        (raws[0]["id"], 1, frozenset()),
    ]


# --- webhooks: one delivery per (endpoint, event), one claimer per attempt, stale workers ignored -------------


def _delivery(engine: Engine) -> tuple[webhooks.Endpoint, webhooks.Delivery]:
    with write_tx(engine) as conn:
        tenant = insert_tenant(conn)
        (task,) = insert_tasks(conn, tenant, 1, status=TaskStatus.SUCCEEDED)
        endpoint = webhooks.add_endpoint(conn, tenant, "https://hook.example/x", ["task.succeeded"], "s1", T0)
        event = new_id()
        first = webhooks.add_delivery(conn, endpoint, event_id=event, event_type="task.succeeded", task_id=task,
                                      payload={"n": 1}, now=T0)  # fmt: skip
        again = webhooks.add_delivery(conn, endpoint, event_id=event, event_type="task.succeeded", task_id=task,
                                      payload={"n": 2}, now=T0)  # fmt: skip
        assert first is not None and again is None
        delivery = webhooks.get_delivery(conn, first)
    assert delivery is not None and delivery.payload == {"n": 1}
    return endpoint, delivery


def test_webhook_endpoints_live_rotate_and_remove(engine: Engine) -> None:
    endpoint, _ = _delivery(engine)
    with write_tx(engine) as conn:
        assert webhooks.get_endpoint(conn, endpoint.id, endpoint.tenant_id, for_update=True) == endpoint
        assert webhooks.get_endpoint(conn, endpoint.id, new_id()) is None
        rotated = webhooks.rotate_secret(conn, endpoint, "s2", T0 + timedelta(hours=1), T0)
        assert webhooks.read_endpoint(conn, endpoint.id) == rotated
        assert (rotated.secret, rotated.previous_secret, rotated.event_filter) == ("s2", "s1", ("task.succeeded",))
        webhooks.remove_endpoint(conn, endpoint.id, T0)
        assert webhooks.get_endpoint(conn, endpoint.id) is None and webhooks.list_endpoints(conn) == []
        assert webhooks.read_endpoint(conn, endpoint.id) is not None  # a delivery still learns it is gone
        assert webhooks.tenant_id_by_ref(conn, str(endpoint.tenant_id)) == endpoint.tenant_id
        assert webhooks.tenant_id_by_ref(conn, f"t-{endpoint.tenant_id}") == endpoint.tenant_id


def test_webhook_claim_is_taken_once_and_a_stale_attempt_changes_nothing(engine: Engine) -> None:
    _, delivery = _delivery(engine)
    hold = T0 + timedelta(seconds=60)
    with write_tx(engine) as conn:
        claimed = webhooks.claim(conn, delivery.id, T0, hold)
        assert claimed is not None and claimed.next_attempt_at == hold
        assert webhooks.claim(conn, delivery.id, T0, hold) is None  # a duplicate message finds nothing due
        webhooks.record_attempt(conn, claimed, state=WebhookDeliveryState.FAILED, attempted_at=T0, status_code=500,
                                error="boom", next_attempt_at=T0, now=T0)  # fmt: skip
        # the same attempt recorded again by a stale worker: guarded by `attempts`, nothing moves
        webhooks.record_attempt(conn, claimed, state=WebhookDeliveryState.DELIVERED, attempted_at=T0,
                                status_code=200, error=None, next_attempt_at=None, now=T0)  # fmt: skip
        after = webhooks.get_delivery(conn, delivery.id)
        assert after is not None and (after.state, after.attempts) == (WebhookDeliveryState.FAILED.value, 1)
        webhooks.kill(conn, delivery.id, "endpoint removed", T0)
        assert webhooks.count_deliveries(conn, states=[WebhookDeliveryState.DEAD.value]) == 1
        assert webhooks.requeue(conn, delivery.id, T0) is True
        assert webhooks.requeue(conn, delivery.id, T0) is False  # PENDING is not replayable
        (row,) = webhooks.list_deliveries(conn, task_id=delivery.task_id)
    assert (row.state, row.attempts, row.first_attempt_at) == (WebhookDeliveryState.PENDING.value, 0, None)


# --- heartbeats: one row per process, upserted -------------------------------------------------------------


def _beat(process: object, at: datetime, backlog: heartbeats.Backlog | None = None) -> heartbeats.Heartbeat:
    return heartbeats.Heartbeat(id=process, roles=("worker", "api"), host="h", pid=1, version="v", kind="serve",  # type: ignore[arg-type]
                                started_at=T0, last_seen=at, activity={"worker": "idle"}, backlog=backlog)  # fmt: skip


def test_heartbeats_upsert_one_row_per_process(engine: Engine) -> None:
    process, other = new_id(), new_id()
    with write_tx(engine) as conn:
        heartbeats.beat(conn, _beat(process, T0))
        heartbeats.beat(conn, _beat(process, T0 + timedelta(seconds=5), heartbeats.Backlog(pending_outbox=2)))
        heartbeats.beat(conn, _beat(other, T0 - timedelta(hours=2)))
        assert heartbeats.mark_stopped(conn, process, T0 + timedelta(seconds=6)) is True
        assert heartbeats.mark_stopped(conn, new_id(), T0) is False
    with read_conn(engine) as conn:
        (row,) = heartbeats.recent(conn, T0 - timedelta(minutes=1))
        assert len(heartbeats.recent(conn, T0 - timedelta(days=1))) == 2
    assert (row.id, row.roles, row.stopped_at) == (process, ("api", "worker"), T0 + timedelta(seconds=6))
    assert row.backlog == heartbeats.Backlog(pending_outbox=2) and row.activity == {"process": "stopped"}
    with write_tx(engine) as conn:
        assert heartbeats.prune(conn, T0 - timedelta(hours=1)) == 1


def test_heartbeat_backlog_counts_the_waiting_work(engine: Engine) -> None:
    with write_tx(engine) as conn:
        tenant = insert_tenant(conn)
        insert_tasks(conn, tenant, 2, status=TaskStatus.QUEUED)
        insert_tasks(conn, tenant, 1, status=TaskStatus.OUTPUT_FETCHING)
        insert_tasks(conn, tenant, 1, status=TaskStatus.MANUAL_REVIEW)
        insert_tasks(conn, tenant, 1, status=TaskStatus.SUCCEEDED)
    with read_conn(engine) as conn:
        got = heartbeats.backlog(conn, T0)
        server_now = heartbeats.database_now(conn)
    assert got == heartbeats.Backlog(pending_outbox=0, queued_tasks=2, due_tasks=0, worker_steps=1, active_tasks=3)
    # dialect-specific by design: only PostgreSQL has a clock of its own to compare with
    assert (server_now is not None) == (engine.dialect.name == "postgresql")


# --- local jobs: first request key wins, one live owner -----------------------------------------------------


def test_local_job_create_is_idempotent_by_request_key(engine: Engine) -> None:
    jobs = LocalJobs(engine, "local")
    job, created = jobs.create("j1", "key-1", {"prompt": "a"}, "owner-a", T0)
    again, created_again = jobs.create("j2", "key-1", {"prompt": "b"}, "owner-b", T0)
    assert (created, created_again) == (True, False)
    assert (again.job_id, again.params, again.owner) == ("j1", {"prompt": "a"}, "owner-a")
    assert LocalJobs(engine, "other").by_key("key-1") is None  # keyed by provider
    assert jobs.get("j2") is None


def test_local_job_is_taken_over_only_from_a_dead_owner(engine: Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("j1", "key-1", {}, "owner-a", T0)
    assert jobs.claim("j1", "owner-b", orphaned=lambda owner: False, now=T0, max_renders=3) is None
    taken = jobs.claim("j1", "owner-b", orphaned=lambda owner: owner == "owner-a", now=T0, max_renders=3)
    assert taken is not None and (taken.owner, taken.state) == ("owner-b", JobStatus.QUEUED)
    assert jobs.record("j1", "owner-a", T0, progress=50) is False  # the old owner writes nothing
    assert jobs.started("j1", "owner-b", T0) is True
    assert jobs.release(["j1"], "owner-b", T0) == 1
    assert jobs.cancel("j1", T0).state is JobStatus.CANCELED  # type: ignore[union-attr]
    assert jobs.claim("j1", "owner-c", orphaned=lambda owner: True, now=T0, max_renders=3) is None
    assert jobs.purge(T0 + timedelta(seconds=1)) == 1 and jobs.get("j1") is None


def test_local_job_whose_renders_keep_dying_fails(engine: Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("j1", "key-1", {}, "owner-a", T0)
    jobs.started("j1", "owner-a", T0)
    assert jobs.claim("j1", "owner-b", orphaned=lambda owner: True, now=T0, max_renders=1) is None
    failed = jobs.get("j1")
    assert failed is not None and (failed.state, failed.owner, failed.renders) == (JobStatus.FAILED, None, 1)


# --- workflow steps: concurrent claimers never take the same step -------------------------------------------


def _two_due_steps(engine: Engine) -> set[object]:
    ids = set()
    with write_tx(engine) as conn:
        tenant = insert_tenant(conn)
        for n in range(2):  # one project each: moving a step locks its project's row (the event sequence)
            project = wf.insert_project(conn, tenant_id=tenant, workflow="photo_story", user_ref=f"u{n}", priority=1,
                                        formal=False, idempotency_key=None, input={}, input_hash=f"h{n}",
                                        cost_estimate=Decimal(0), now=T0)  # fmt: skip
            step = wf.insert_step(conn, project=project, step_key="check", task_type=StepType.PHOTO_CHECK,
                                  input_json={}, input_hash="s", now=T0)  # fmt: skip
            assert step is not None
            assert wf.insert_step(conn, project=project, step_key="check", task_type=StepType.PHOTO_CHECK,
                                  input_json={}, input_hash="s", now=T0) is None  # fmt: skip
            ids.add(step.id)
    return ids


def _claim_one(conn: sa.Connection, queue: str) -> wf.Step:
    (step,) = wf.due_steps(conn, [queue], T0, limit=1)
    return wf.move_step(conn, step, event="claimed", to_status=StepStatus.RUNNING, now=T0)


def test_due_steps_are_claimed_by_one_claimer_each(engine: Engine) -> None:
    """A claimer holds its step until it commits. On PostgreSQL a second claimer meanwhile skips the locked row
    (SKIP LOCKED: without it, it would wait, and the lock timeout fails the test); on SQLite the second one
    cannot begin before the first commits (BEGIN IMMEDIATE). Either way the two never take the same step."""
    ids = _two_due_steps(engine)
    queue = wf.STEP_SPECS[StepType.PHOTO_CHECK].queue.value
    postgres = engine.dialect.name == "postgresql"
    with write_tx(engine) as first:
        mine = _claim_one(first, queue)
        if postgres:
            with write_tx(engine) as second:
                second.exec_driver_sql("SET LOCAL lock_timeout = '5s'")
                theirs = _claim_one(second, queue)
    if not postgres:
        with write_tx(engine) as second:
            theirs = _claim_one(second, queue)
    assert {mine.id, theirs.id} == ids
    with read_conn(engine) as conn:
        assert wf.due_steps(conn, [queue], T0, limit=5) == []
        assert {s.id for s in wf.running_steps(conn)} == ids
