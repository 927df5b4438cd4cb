"""Cancellation after dispatch, deadlines, stale and contradicting observations."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import alerts, credit_ledger, generation_tasks, task_state_events
from aivedio_engine.domain.status import EventSource
from aivedio_engine.providers.base import JobStatus, Observation
from aivedio_engine.services import observations
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def _task(ctx, task_id):  # type: ignore[no-untyped-def]
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()


def _ledger(ctx, task_id):  # type: ignore[no-untyped-def]
    with ctx.engine.connect() as conn:
        return {
            r.entry_type: r.amount
            for r in conn.execute(sa.select(credit_ledger).where(credit_ledger.c.task_id == task_id))
        }


def test_cancel_a_running_job_confirms_and_settles_by_billing(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=21, job_seconds=60) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        [tid] = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=6)
        drv.run_until(lambda: drv.all_in("RUNNING"))
        view = ctx.generations.cancel(_task(ctx, tid).tenant_id, tid)
        assert view.status == "CANCEL_REQUESTED"
        drv.run_until(lambda: drv.all_in("CANCELED"))
        row = _task(ctx, tid)
        assert row.cancel_outcome == "CANCELED" and row.reserved_amount == 0
        job = sim.truth()["jobs"][0]
        assert job["canceled"] and job["billed"]  # it had started: the sim charges it
        assert "SETTLE" in _ledger(ctx, tid) and row.actual_cost == row.estimated_cost
        ctx.close()


def test_cancel_too_late_lets_completion_win(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=22, faults="cancel_too_late=1", job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        [tid] = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=6)
        drv.run_until(lambda: drv.all_in("RUNNING"))
        ctx.generations.cancel(_task(ctx, tid).tenant_id, tid)
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        assert _task(ctx, tid).cancel_outcome == "TOO_LATE"
        ctx.close()


def test_cancel_while_submit_unknown_waits_for_reconciliation(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=23, faults="ambiguous=1", job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        [tid] = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=2)
        drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"))
        ctx.generations.cancel(_task(ctx, tid).tenant_id, tid)
        sim.set_faults("")
        drv.run_until(lambda: drv.all_in("CANCELED"))
        truth = sim.truth()
        assert len(truth["jobs"]) == 1 and truth["jobs"][0]["canceled"]  # found by lookup, then canceled
        ctx.close()


def test_deadline_expires_a_queued_task_and_releases_credits(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=24) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, max_concurrency=1)
        [a, b] = create_tasks(ctx, 2)
        with ctx.engine.begin() as conn:  # b's deadline is near; a holds the only slot
            conn.execute(
                generation_tasks.update().where(generation_tasks.c.id == b).values(deadline_at=ctx.clock.now())
            )
        sim.configure(job_seconds=600)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=1)
        drv.round()
        drv.round()
        row = _task(ctx, b)
        assert row.status == "EXPIRED" and row.reserved_amount == 0
        assert _ledger(ctx, b)["RELEASE"] == Decimal(row.estimated_cost)
        assert _task(ctx, a).status in ("SUBMITTED", "RUNNING")
        ctx.close()


def test_stale_and_contradicting_observations_are_recorded_not_applied(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=25, job_seconds=60) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        [tid] = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=6)
        drv.run_until(lambda: drv.all_in("RUNNING"))
        job_id = sim.truth()["jobs"][0]["id"]
        ctx.generations.cancel(_task(ctx, tid).tenant_id, tid)
        drv.run_until(lambda: drv.all_in("CANCELED"))
        version = _task(ctx, tid).version
        from datetime import timedelta

        old = ctx.clock.now() - timedelta(hours=1)
        late_success = Observation(
            job_id=job_id,
            status=JobStatus.SUCCEEDED,
            event_id="late-1",
            provider_updated_at=ctx.clock.now() + timedelta(seconds=1),
        )
        stale_running = Observation(
            job_id=job_id, status=JobStatus.RUNNING, event_id="stale-1", provider_updated_at=old
        )
        with ctx.engine.begin() as conn:
            observations.record(conn, "sim", late_success, EventSource.CALLBACK, ctx.clock.now())
            observations.record(conn, "sim", stale_running, EventSource.CALLBACK, ctx.clock.now())
        drv.pump.run()
        assert _task(ctx, tid).status == "CANCELED" and _task(ctx, tid).version == version
        with ctx.engine.connect() as conn:
            outcomes = {
                r.source_event_id: r.outcome
                for r in conn.execute(
                    sa.select(task_state_events).where(
                        task_state_events.c.source_event_id.in_(["wh:late-1", "wh:stale-1"])
                    )
                )
            }
            rules = [r.rule for r in conn.execute(sa.select(alerts))]
        assert outcomes == {"wh:late-1": "anomaly", "wh:stale-1": "stale"}
        assert "late_event_after_terminal" in rules
        ctx.close()
