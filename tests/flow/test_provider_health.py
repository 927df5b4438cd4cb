"""Circuit breaker and 429 back-off, derived from recorded attempts (so every scheduler process agrees)."""

from __future__ import annotations

from pathlib import Path

from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def test_breaker_opens_after_5_failures_and_probes_after_30s(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=51, faults="5xx=1", job_seconds=2) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            max_concurrency=20,
            retry={"submit": {"max_attempts": 10, "base_delay_s": 1, "max_delay_s": 1}},
        )
        create_tasks(ctx, 20)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=2)
        drv.round()  # 20 dispatched together, all fail: ≥ 5 consecutive failures open the breaker
        submits_before = sim.truth()["calls"]["submit"]
        assert submits_before == 20
        for _ in range(10):  # 20 s: still open, the retries stay queued
            drv.round()
        assert sim.truth()["calls"]["submit"] == submits_before
        sim.set_faults("")
        for _ in range(6):  # past 30 s: one probe, it succeeds, the breaker closes, the rest flow
            drv.round()
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        assert len(sim.truth()["jobs"]) == 20
        ctx.close()


def test_429_with_retry_after_pauses_submits(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=52, faults="429=1,retry_after=20s", job_seconds=2) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            max_concurrency=8,
            retry={"submit": {"max_attempts": 10, "base_delay_s": 1, "max_delay_s": 1}},
        )
        create_tasks(ctx, 8)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=2)
        drv.round()
        first = sim.truth()["calls"]["submit"]
        sim.set_faults("")
        for _ in range(5):  # 10 s < Retry-After 20 s: nothing new is sent
            drv.round()
        assert sim.truth()["calls"]["submit"] == first
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        assert len(sim.truth()["jobs"]) == 8
        ctx.close()
