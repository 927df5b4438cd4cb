"""Ambiguous submits to a vendor without lookup by request key, reconciled by listing its recent jobs and matching
the request fingerprint, on real PostgreSQL against the sim with both clocks under control."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts, generation_tasks, task_attempts
from tests.support.app import tenant_with_key
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle, running_sim

NO_LOOKUP = {"supports_lookup_by_request_key": False}


@pytest.fixture
def pg(pg_url: str) -> str:
    return pg_url


def _context(
    tmp_path: Path, sim: SimHandle, pg: str, *, resubmit: bool = True, park_after_s: float = 900
) -> AppContext:
    return sim_context(
        tmp_path,
        sim,
        pg,
        provider=NO_LOOKUP,
        reconcile={"lookup_after_s": [10, 60, 300], "park_after_s": park_after_s, "resubmit_without_lookup": resubmit},
    )


def _count(ctx: AppContext, stmt: Any) -> int:
    with ctx.engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def _resubmits(ctx: AppContext) -> int:
    return _count(
        ctx, sa.select(sa.func.count()).select_from(task_attempts).where(task_attempts.c.resubmitted_after_unknown)
    )


def _alerts(ctx: AppContext, rule: str) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(alerts).where(alerts.c.rule == rule)))


def _went_unknown(ctx: AppContext) -> int:
    return _count(
        ctx, sa.text("SELECT count(DISTINCT task_id) FROM task_state_events WHERE to_status = 'SUBMIT_UNKNOWN'")
    )


def test_list_and_match_resolves_every_ambiguous_submit_without_duplicates(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=3, faults="ambiguous=0.2", job_seconds=3, lookup=False) as sim:
        sim.configure(listing=True)
        # resubmitting is allowed: that none happens shows the listing answered, not the fallback
        ctx = _context(tmp_path, sim, pg, resubmit=True)
        create_tasks(ctx, 100)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        assert len(truth["jobs"]) == 100 and truth["duplicate_paid_jobs"] == 0
        assert sum(1 for j in truth["jobs"] if j["billed"]) == 100
        assert _went_unknown(ctx) >= 10  # ~20 % went through SUBMIT_UNKNOWN
        assert _resubmits(ctx) == 0 and drv.attempts_per_task() == {1: 100}
        assert not _alerts(ctx, "resubmit_without_lookup") and not _alerts(ctx, "ambiguous_list_match")
        assert truth["calls"]["find"] == 0 and truth["calls"]["list"] >= _went_unknown(ctx)
        ctx.close()


def test_a_job_the_listing_does_not_show_yet_is_not_taken_for_absent(tmp_path: Path, pg: str) -> None:
    # fresh jobs stay out of the vendor's listing for 30 s: the lookup at +10 s sees nothing, which is not
    # believed before the visibility lag (60 s); the one at +60 s finds the job
    with running_sim(seed=5, faults="ambiguous=1,invisible=30s", job_seconds=3, lookup=False) as sim:
        sim.configure(listing=True)
        ctx = _context(tmp_path, sim, pg, resubmit=True)
        create_tasks(ctx, 5)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        assert len(sim.truth()["jobs"]) == 5 and _resubmits(ctx) == 0
        assert sim.truth()["calls"]["list"] >= 10  # at least two listings per task
        with ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(
                    task_attempts.c.submitted_at, task_attempts.c.last_not_found_at, task_attempts.c.provider_job_id
                )
            ).all()
        # each missed once, early enough not to be believed, then was found
        assert all(r.provider_job_id and r.last_not_found_at is not None for r in rows), rows
        assert all((r.last_not_found_at - r.submitted_at).total_seconds() < 60 for r in rows)
        ctx.close()


def test_submits_that_never_arrived_are_confirmed_absent_and_resubmitted_once(tmp_path: Path, pg: str) -> None:
    # `reset` drops the connection without creating a job: client-side it looks exactly like `ambiguous`
    with running_sim(seed=6, faults="reset=0.3", job_seconds=3, lookup=False) as sim:
        sim.configure(listing=True)
        ctx = _context(tmp_path, sim, pg, resubmit=False)
        create_tasks(ctx, 30)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        truth = sim.truth()
        assert len(truth["jobs"]) == 30 and truth["duplicate_paid_jobs"] == 0
        resubmits = _resubmits(ctx)
        assert resubmits >= 3  # each confirmed "not created" by a complete listing ≥ 60 s after the send
        assert _count(ctx, sa.select(sa.func.count()).select_from(task_attempts)) == 30 + resubmits
        assert not _alerts(ctx, "resubmit_without_lookup") and not _alerts(ctx, "submit_unknown_parked")
        ctx.close()


def test_identical_requests_sent_ambiguously_together_are_parked_not_guessed(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=7, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        sim.configure(listing=True)
        ctx = _context(tmp_path, sim, pg, resubmit=True)  # even with resubmits allowed: never on a known match
        params = {"prompt": "the same harbour at dawn", "model": "sim-v1", "duration_s": 2}
        twins = [
            ctx.generations.create(tenant_with_key(ctx, name, credits=1000).tenant_id, "same-key", params).task.id
            for name in ("tenant-a", "tenant-b")
        ]
        [single] = create_tasks(ctx, 1, prefix="solo")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))

        def settled() -> bool:
            with ctx.engine.connect() as conn:
                parked = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(generation_tasks)
                    .where(generation_tasks.c.id.in_(twins), generation_tasks.c.parked_reason.is_not(None))
                ).scalar_one()
            return parked == 2 and drv.statuses()["OUTPUT_FETCHING"] == 1

        drv.run_until(settled, max_rounds=60)
        truth = sim.truth()
        assert len(truth["jobs"]) == 3 and truth["duplicate_paid_jobs"] == 0 and _resubmits(ctx) == 0
        twin_jobs = sorted(j["id"] for j in truth["jobs"] if j["request_key"] not in _keys(ctx, [single]))
        raised = _alerts(ctx, "ambiguous_list_match")
        assert {r.subject_id for r in raised} == {str(t) for t in twins}
        for alert in raised:
            assert alert.severity == "critical" and alert.status == "OPEN"
            assert sorted(alert.details["candidate_job_ids"]) == twin_jobs
            assert all(job in alert.message for job in twin_jobs)
        with ctx.engine.connect() as conn:
            rows = conn.execute(
                sa.select(task_attempts.c.task_id, task_attempts.c.submit_state, task_attempts.c.provider_job_id).where(
                    task_attempts.c.task_id.in_(twins)
                )
            ).all()
        assert sorted(r.submit_state for r in rows) == ["UNKNOWN", "UNKNOWN"]
        assert all(r.provider_job_id is None for r in rows)  # neither job was guessed onto a task
        assert not _alerts(ctx, "resubmit_without_lookup")
        ctx.close()


def _keys(ctx: AppContext, task_ids: list[Any]) -> set[str]:
    with ctx.engine.connect() as conn:
        return {
            r[0]
            for r in conn.execute(
                sa.select(task_attempts.c.provider_request_key).where(task_attempts.c.task_id.in_(task_ids))
            )
        }


def test_a_vendor_that_can_neither_look_up_nor_list_waits_out_the_window_then_parks(tmp_path: Path, pg: str) -> None:
    with running_sim(seed=8, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:  # listing stays off
        ctx = _context(tmp_path, sim, pg, resubmit=False, park_after_s=120)
        ids = create_tasks(ctx, 5)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))

        def parked() -> bool:
            with ctx.engine.connect() as conn:
                return (
                    conn.execute(
                        sa.select(sa.func.count())
                        .select_from(generation_tasks)
                        .where(generation_tasks.c.parked_reason.is_not(None))
                    ).scalar_one()
                    == 5
                )

        rounds = drv.run_until(parked, max_rounds=60)
        assert rounds * drv.step_s >= 120  # not before the window ended
        assert len(sim.truth()["jobs"]) == 5 and _resubmits(ctx) == 0
        assert {r.subject_id for r in _alerts(ctx, "submit_unknown_parked")} == {str(t) for t in ids}
        assert not _alerts(ctx, "ambiguous_list_match")
        ctx.close()
