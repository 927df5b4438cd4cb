"""Degradation behaviours, each with the dependency taken away under load.

Redis goes away through a TCP proxy in front of a private redis-server (the shared one is never touched).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks, task_attempts
from aivedio_engine.domain.status import GENERATED_PROCESSING, USER_STAGE, DerivativeProfile, TaskStatus
from aivedio_engine.media import derive
from aivedio_engine.testing.tcpproxy import TcpProxy
from tests.contract import private_redis
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def _pump(ctx: Any) -> Pump:
    # status changes are consumed too: their SSE signal drops what Redis does not take, and nothing may raise
    return Pump(ctx, stop_at_fetch=True)


def _ledger(ctx: Any) -> dict[str, int]:
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(credit_ledger.c.entry_type, sa.func.count()).group_by(credit_ledger.c.entry_type))
        return {str(k): int(n) for k, n in rows}


@pytest.mark.parametrize("mode", ["pg_count", "pause"])
def test_redis_down_dispatch_degrades_and_recovers(tmp_path: Path, pg_url: str, mode: str) -> None:
    with private_redis() as client, running_sim(seed=5, job_seconds=30) as sim:
        sock = client.connection_pool.connection_kwargs["path"]
        with TcpProxy(sock) as proxy:
            ctx = sim_context(
                tmp_path,
                sim,
                pg_url,
                max_concurrency=100,
                mode="distributed",
                redis={"url": proxy.url("redis", "/0"), "key_prefix": "degrade:"},
                limits={
                    "platform_max_concurrency": 4,
                    "tenant_default_max_concurrency": 100,
                    "redis_down_dispatch": mode,
                    "redis_down_fraction": 0.5,
                },
            )
            create_tasks(ctx, 2)
            drv = Driver(ctx, sim, _pump(ctx), step_s=2)
            drv.run_until(lambda: drv.statuses()["RUNNING"] == 2)
            create_tasks(ctx, 8, prefix="late")
            proxy.cut()
            for _ in range(3):
                drv.round()  # the sweeper's slot reconcile fails too; nothing may raise
            assert ctx.dispatcher.degraded == mode
            statuses = drv.statuses()
            assert statuses["FAILED_FINAL"] == 0 and statuses["RETRY_WAIT"] == 0
            in_flight = sum(statuses[s] for s in ("DISPATCHING", "SUBMITTED", "RUNNING"))
            # pg_count: 4 × 0.5 = 2 slots, both already held by the running pair; pause: nothing new either way
            assert in_flight == 2 and statuses["QUEUED"] == 8
            assert drv.attempts_per_task() == {1: 2}
            proxy.restore()
            drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
            assert ctx.dispatcher.degraded is None
            truth = sim.truth()
            assert truth["duplicate_paid_jobs"] == 0 and len(truth["jobs"]) == 10
            assert truth["max_concurrent_running"] <= 4
            assert drv.attempts_per_task() == {1: 10}
            assert _ledger(ctx).get("RESERVE") == 10  # nothing re-reserved
            ctx.close()


def test_redis_down_pg_count_dispatches_within_the_scaled_limit(tmp_path: Path, pg_url: str) -> None:
    with private_redis() as client, running_sim(seed=6, job_seconds=30) as sim:
        sock = client.connection_pool.connection_kwargs["path"]
        with TcpProxy(sock) as proxy:
            ctx = sim_context(
                tmp_path,
                sim,
                pg_url,
                mode="distributed",
                redis={"url": proxy.url("redis", "/0"), "key_prefix": "degrade2:"},
                limits={"platform_max_concurrency": 6, "tenant_default_max_concurrency": 100},
            )
            create_tasks(ctx, 10)
            proxy.cut()
            drv = Driver(ctx, sim, _pump(ctx), step_s=2)
            for _ in range(4):
                drv.round()
            statuses = drv.statuses()
            assert statuses["QUEUED"] == 7, statuses  # 6 × 0.5 = 3 dispatched from PostgreSQL's counts
            assert statuses["FAILED_FINAL"] == 0
            with ctx.engine.connect() as conn:
                fences = [r[0] for r in conn.execute(sa.select(task_attempts.c.fencing_token))]
            assert len(set(fences)) == 3 and min(fences) > 1_000_000  # past the reseed gap, never repeated
            proxy.restore()
            drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
            assert sim.truth()["max_concurrent_running"] <= 6 and drv.attempts_per_task() == {1: 10}
            ctx.close()


def test_fetch_pressure_lowers_new_dispatch(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=7, job_seconds=2) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            limits={"platform_max_concurrency": 4, "tenant_default_max_concurrency": 100},
            fetch={"pressure_urgent_outputs": 1, "pressure_dispatch_fraction": 0.5},
        )
        (first,) = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, _pump(ctx), step_s=3)
        drv.run_until(lambda: drv.statuses()["OUTPUT_FETCHING"] == 1)
        soon = ctx.clock.now() + timedelta(seconds=60)  # within fetch.urgent_within_s (900)
        with ctx.engine.begin() as conn:
            conn.execute(
                task_attempts.update().where(task_attempts.c.task_id == first).values(output_url_expires_at=soon)
            )
        create_tasks(ctx, 6, prefix="new")
        assert ctx.dispatcher.run_once() == 2  # 4 × 0.5 while an output is about to expire
        with ctx.engine.begin() as conn:
            conn.execute(
                task_attempts.update()
                .where(task_attempts.c.task_id == first)
                .values(output_url_expires_at=soon + timedelta(hours=2))
            )
        assert ctx.dispatcher.run_once() == 2  # the full limit again: 4 in flight
        ctx.close()


@pytest.mark.parametrize("proxy_only", [True, False])
def test_media_down_hls_fails_proxy_ready(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch, proxy_only: bool
) -> None:
    real = derive.build_derivatives

    def hls_broken(*args: Any, **kwargs: Any) -> dict[DerivativeProfile, derive.DerivativeResult]:
        out = real(*args, **kwargs)
        out[DerivativeProfile.HLS] = derive.DerivativeResult(
            DerivativeProfile.HLS, "FAILED", error="segmenter unavailable", retryable=True
        )
        return out

    monkeypatch.setattr(derive, "build_derivatives", hls_broken)
    with running_sim(seed=8, job_seconds=1) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, media={"succeed_with_proxy_only": proxy_only})
        (task_id,) = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx), step_s=2)
        drv.run_until(lambda: drv.statuses()["POST_PROCESSING"] + drv.statuses()["SUCCEEDED"] == 1)
        if proxy_only:
            # stop at the success: further rounds with HLS still broken could spend the late runs' tries, and the
            # next run's delay (up to 120 s, then 300 s) would then outlast the rounds given below
            drv.run_until(lambda: drv.statuses()["SUCCEEDED"] == 1)
        else:
            for _ in range(3):
                drv.round()
        with ctx.engine.connect() as conn:
            status = conn.execute(sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)).scalar()
            rows = conn.execute(sa.select(assets.c.profile, assets.c.status).where(assets.c.task_id == task_id))
            profiles = {str(p): str(st) for p, st in rows}
        assert profiles["proxy_mp4"] == "READY" and profiles["hls"] == "FAILED"
        if proxy_only:
            assert status == "SUCCEEDED" and USER_STAGE[TaskStatus(status)] == "done"
            monkeypatch.setattr(derive, "build_derivatives", real)  # the media cluster is back
            # a late run is due within the first budget's cap (30 s), or the second's (120 s) if one ran before the
            # restore: 100 rounds of 2 s cover both
            drv.run_until(lambda: _profile_status(ctx, task_id, "hls") == "READY", max_rounds=100)
            assert _ledger(ctx).get("SETTLE") == 1  # the late derivative settles nothing again
        else:
            assert status == "POST_PROCESSING" and USER_STAGE[TaskStatus(status)] == GENERATED_PROCESSING
            assert profiles["None"] == "READY"  # the raw output is kept
        ctx.close()


def _profile_status(ctx: Any, task_id: Any, profile: str) -> str | None:
    with ctx.engine.connect() as conn:
        return conn.execute(
            sa.select(assets.c.status).where(assets.c.task_id == task_id, assets.c.profile == profile)
        ).scalar()
