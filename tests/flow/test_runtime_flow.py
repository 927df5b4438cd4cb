"""The real process roles (relay, worker, scheduler, sweeper) in embedded mode carry a task to the provider's
verdict and on to a playable output with the local ffmpeg provider: the path `aivedio serve --role all` runs."""

from __future__ import annotations

import threading
from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import generation_tasks, outbox_events, task_attempts
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import make_context, tenant_with_key
from tests.support.sim import wait_until


def test_embedded_roles_take_a_task_to_succeeded(tmp_path: Path) -> None:
    ctx = make_context(
        tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0}, sweeper={"interval_s": 0.5}
    )
    who = tenant_with_key(ctx, "alice", credits=100)
    stop = threading.Event()
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, stop)
    runtime.start()
    try:
        task = ctx.generations.create(
            who.tenant_id, "k", {"prompt": "rain on a window", "model": "local-v1", "duration_s": 2}
        ).task

        def status() -> str:
            with ctx.engine.connect() as conn:
                return conn.execute(
                    sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task.id)
                ).scalar_one()

        wait_until(lambda: status() == "SUCCEEDED", timeout_s=90, what="SUCCEEDED")
        with ctx.engine.connect() as conn:
            attempt = conn.execute(sa.select(task_attempts)).one()
            submits = conn.execute(
                sa.select(outbox_events.c.status).where(outbox_events.c.event_type == "provider.submit.requested")
            ).all()
        assert attempt.submit_state == "SUCCEEDED"
        assert [s.status for s in submits] == ["PUBLISHED"]
        assert set(ctx.outputs.local_paths(who.tenant_id, task.id)) >= {"proxy_mp4", "hls", "thumbnail"}
        assert runtime.failed is None
    finally:
        runtime.shutdown()
        ctx.close()
