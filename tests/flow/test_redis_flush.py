"""Distributed mode with Redis slots: FLUSHALL mid-run loses nothing, limits hold, work resumes at once."""

from __future__ import annotations

from pathlib import Path

from tests.contract import private_redis
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def test_flushall_mid_run(tmp_path: Path, pg_url: str) -> None:
    with private_redis() as client, running_sim(seed=31, job_seconds=20) as sim:
        sock = client.connection_pool.connection_kwargs["path"]
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            max_concurrency=3,
            mode="distributed",
            redis={"url": f"unix://{sock}", "key_prefix": "flush-test:"},
        )
        create_tasks(ctx, 12)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=6)
        drv.run_until(lambda: drv.statuses()["OUTPUT_FETCHING"] >= 3)
        before = sim.truth()
        client.flushall()
        assert ctx.slots.counts() == {}
        dispatched_after = 0
        for _ in range(2):  # "work resumes within two sweeps"
            drv.round()
            dispatched_after = len(sim.truth()["jobs"]) - len(before["jobs"])
            if dispatched_after:
                break
        assert dispatched_after > 0
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        assert truth["max_concurrent_running"] <= 3  # the limit held across the flush
        assert len(truth["jobs"]) == 12 and truth["duplicate_paid_jobs"] == 0
        assert drv.attempts_per_task() == {1: 12}
        ctx.close()
