"""Many generations against the sim provider on real PostgreSQL: duplicates, ambiguity, limits, callbacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts, credit_ledger, generation_tasks, task_attempts
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


@pytest.fixture
def pg(pg_url: str) -> str:
    return pg_url


def _close(ctx: AppContext) -> None:
    ctx.close()


def test_500_tasks_every_message_delivered_twice(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=1, job_seconds=3) as sim:
        # the parked fetch requests are counted: none may be re-driven during the run (fetch_stuck_s)
        ctx = sim_context(tmp_path, sim, pg, max_concurrency=100, sweeper={"fetch_stuck_s": 900})
        ids = create_tasks(ctx, 500)
        drv = Driver(ctx, sim, Pump(ctx, duplicate_every=1, stop_at_fetch=True))
        rounds = drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        assert len(truth["jobs"]) == 500 and truth["duplicate_paid_jobs"] == 0
        assert set(truth["by_request_key"].values()) == {1}
        assert drv.attempts_per_task() == {1: 500}
        assert drv.pump.seen["provider.submit.requested"] >= 1000  # every submit message arrived twice
        assert len([e for e in drv.pump.parked if e["event_type"] == "fetch.requested"]) == 500
        assert rounds < 60
        _close(ctx)
        assert len(ids) == 500


def test_ambiguous_submits_with_lookup_make_no_duplicate_jobs(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=2, faults="ambiguous=0.2", job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim, pg)
        create_tasks(ctx, 100)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        assert truth["duplicate_paid_jobs"] == 0 and len(truth["jobs"]) == 100
        with ctx.engine.connect() as conn:
            unknown_seen = conn.execute(
                sa.text("SELECT count(DISTINCT task_id) FROM task_state_events WHERE to_status = 'SUBMIT_UNKNOWN'")
            ).scalar_one()
            resubmits = conn.execute(
                sa.select(sa.func.count()).select_from(task_attempts).where(task_attempts.c.resubmitted_after_unknown)
            ).scalar_one()
        assert unknown_seen >= 10  # ~20 % of 100 went through SUBMIT_UNKNOWN and were resolved
        assert resubmits == 0
        _close(ctx)


def test_without_lookup_duplicates_equal_recorded_resubmits_each_alerted(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=3, faults="ambiguous=0.2", job_seconds=3, lookup=False) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60, 300], "park_after_s": 120, "resubmit_without_lookup": True},
        )
        create_tasks(ctx, 60)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        with ctx.engine.connect() as conn:
            resubmits = conn.execute(
                sa.select(sa.func.count()).select_from(task_attempts).where(task_attempts.c.resubmitted_after_unknown)
            ).scalar_one()
            alert_count = conn.execute(
                sa.select(sa.func.count()).select_from(alerts).where(alerts.c.rule == "resubmit_without_lookup")
            ).scalar_one()
        # each resubmit carries a new request key, so the sim sees a new job: duplicates = paid jobs − tasks
        paid = sum(1 for j in truth["jobs"] if j["billed"])
        assert resubmits > 0
        assert paid - 60 == resubmits == alert_count
        _close(ctx)


def test_provider_concurrency_limit_is_never_exceeded(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=4, job_seconds=10) as sim:
        ctx = sim_context(tmp_path, sim, pg, max_concurrency=3)
        create_tasks(ctx, 30)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"), max_rounds=400)
        assert sim.truth()["max_concurrent_running"] <= 3
        assert len(sim.truth()["jobs"]) == 30
        _close(ctx)


def test_rejections_retry_then_fail_with_credits_released(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=5, faults="5xx=1", job_seconds=1) as sim:
        ctx = sim_context(tmp_path, sim, pg, retry={"submit": {"base_delay_s": 1, "max_delay_s": 2, "max_attempts": 3}})
        create_tasks(ctx, 5, credits=1000)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("FAILED_FINAL"))
        assert sim.truth()["jobs"] == []
        assert drv.attempts_per_task() == {3: 5}
        with ctx.engine.connect() as conn:
            ledger = conn.execute(sa.select(sa.func.sum(credit_ledger.c.amount))).scalar_one()
            errs = {r[0] for r in conn.execute(sa.select(generation_tasks.c.last_error_class))}
        assert ledger == 1000  # every reservation released: nothing was created, nothing billed
        assert errs == {"provider_5xx_not_accepted"}
        _close(ctx)
