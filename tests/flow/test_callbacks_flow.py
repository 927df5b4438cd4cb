"""Callbacks through the real HTTP endpoint, with the sim duplicating, reordering, dropping and sending them
early: every task still reaches the right state, each observation applied at most once."""

from __future__ import annotations

from pathlib import Path

import httpx
import sqlalchemy as sa

from aivedio_engine.db.tables import provider_events, task_attempts, task_state_events
from tests.support.app import free_port, running_api
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import SECRET, running_sim


def test_faulty_callbacks_converge(tmp_path: Path, pg_url: str) -> None:
    faults = "dup_cb=0.3,reorder_cb=0.3,drop_cb=0.1,early_cb=0.05"
    with running_sim(seed=11, faults=faults, job_seconds=12) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, polling={"min_interval_s": 30, "max_interval_s": 60, "jitter": 0.2})
        with running_api(ctx) as base:
            sim.configure(webhook_url=f"{base}/v1/callbacks/sim")
            create_tasks(ctx, 80)
            drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=4, callbacks=True)
            drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"), max_rounds=150)
            stats = sim.truth()["callbacks"]
        assert stats["duplicates"] > 0 and stats["dropped"] > 0 and stats["reordered"] > 0 and stats["early"] > 0
        with ctx.engine.connect() as conn:
            cb = conn.execute(
                sa.select(sa.func.count()).select_from(provider_events).where(provider_events.c.source == "callback")
            ).scalar_one()
            orphans_left = conn.execute(
                sa.select(sa.func.count()).select_from(provider_events).where(provider_events.c.orphan)
            ).scalar_one()
            applied_success = conn.execute(
                sa.select(sa.func.count())
                .select_from(task_state_events)
                .where(task_state_events.c.to_status == "OUTPUT_FETCHING")
            ).scalar_one()
        assert cb > 0
        assert orphans_left == 0  # early callbacks were kept, then rematched once the job id was recorded
        assert applied_success == 80  # one success transition per task, despite duplicate deliveries
        ctx.close()


def test_callback_endpoint_rejects_forgeries_with_4xx(tmp_path: Path) -> None:
    from aivedio_engine.providers.webhooks import sign_webhook

    with running_sim(seed=12) as sim:
        ctx = sim_context(tmp_path, sim)
        with running_api(ctx) as base:
            url = f"{base}/v1/callbacks/sim"
            body = b'{"id":"job_x","status":"succeeded","event_id":"evt_1"}'
            import time

            ts = str(int(time.time()))
            good = sign_webhook([SECRET], "msg_1", int(ts), body)["webhook-signature"]
            cases = [
                ({}, body, {400, 401}),
                ({"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": "v1,AAAA"}, body, {401}),
                (
                    {"webhook-id": "msg_1", "webhook-timestamp": "yesterday", "webhook-signature": "v1,AAAA"},
                    body,
                    {401},
                ),
                ({"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": good}, body + b" ", {401}),
                ({"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": good}, b"\xff\xfe", {401}),
            ]
            for headers, payload, expected in cases:
                r = httpx.post(url, content=payload, headers=headers)
                assert r.status_code in expected, (headers, r.status_code, r.text)
                assert r.headers["content-type"].startswith("application/problem+json")
            assert httpx.post(f"{base}/v1/callbacks/nope", content=body).status_code == 404
            big = httpx.post(url, content=b"x" * (300 * 1024))
            assert big.status_code == 413
            ok = httpx.post(
                url, content=body, headers={"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": good}
            )
            assert ok.status_code == 200 and ok.json() == {"received": 1, "stored": 1}
            again = httpx.post(
                url, content=body, headers={"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": good}
            )
            assert again.status_code == 200 and again.json()["stored"] == 0  # a replay stores nothing
        with ctx.engine.connect() as conn:
            rows = conn.execute(sa.select(provider_events.c.orphan)).all()
        assert [r.orphan for r in rows] == [True]  # unknown job: kept as an orphan, not dropped
        ctx.close()


def test_sim_calls_back_each_job_as_its_vendors_do_and_no_poll_is_needed(tmp_path: Path) -> None:
    """Vendors with webhooks (Replicate, fal, Kling; not Runway) take a per-job callback URL and call it on every
    status change. The sim does the same once the engine gives it one (webhook secrets + api.public_base_url):
    with polls ten minutes apart, the tasks reach SUCCEEDED on callbacks alone."""
    port = free_port()
    with running_sim(seed=13, job_seconds=4) as sim:  # no account-wide webhook_url: only the per-job URL
        ctx = sim_context(
            tmp_path,
            sim,
            api={"public_base_url": f"http://127.0.0.1:{port}"},
            polling={"min_interval_s": 600, "max_interval_s": 600, "jitter": 0},
        )
        with running_api(ctx, port=port):
            create_tasks(ctx, 3)
            drv = Driver(ctx, sim, Pump(ctx), step_s=2, callbacks=True)
            drv.run_until(lambda: drv.all_in("SUCCEEDED"), max_rounds=30)
            stats = sim.truth()["callbacks"]
        with ctx.engine.connect() as conn:
            sources = {r[0] for r in conn.execute(sa.select(provider_events.c.source))}
            polls = conn.execute(sa.select(sa.func.sum(task_attempts.c.poll_count))).scalar_one()
        assert stats["delivered"] >= 6 and stats["failed"] == 0  # running and succeeded, for each of the 3 jobs
        assert sources == {"callback"} and polls == 0
        ctx.close()
