"""Crash-point matrix for the provider path (R2): a process dies at one point, a fresh
one carries on from the database; afterwards every task is where it should be and no job was paid twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointError
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

POINTS = [
    "dispatch.after_acquire",  # slot lease taken, then death before the attempt exists (lease leak)
    "submit.before_call",  # attempt SENDING committed, death before the HTTP send
    "submit.after_call",  # provider said 2xx, death before the job id is recorded
    "reducer.after_cas",  # between the CAS and the outbox insert: one transaction, so both or neither
    "consume.before_commit",  # consumer after inbox insert, before commit
    "sweeper.mid_batch",
]


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    yield
    failpoints.reset()


@pytest.mark.parametrize("point", POINTS)
def test_crash_once_at_each_point(tmp_path: Path, pg_url: str, point: str) -> None:
    with running_sim(seed=41, job_seconds=12) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, max_concurrency=5)
        create_tasks(ctx, 20)
        failpoints.configure(f"{point}=raise@3")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=6)
        crashes = 0
        for _ in range(200):
            if drv.all_in("OUTPUT_FETCHING"):
                break
            try:
                drv.round()
            except FailpointError:
                crashes += 1  # the "process" died; the next round is a fresh one reading the same database
                drv.pump = Pump(ctx, stop_at_fetch=True)
        assert crashes == 1 and failpoints.hits(point) >= 3
        assert drv.all_in("OUTPUT_FETCHING"), drv.statuses()
        truth = sim.truth()
        assert truth["duplicate_paid_jobs"] == 0 and len(truth["jobs"]) == 20
        assert truth["max_concurrent_running"] <= 5
        ctx.close()
