"""An ambiguous submit is looked up at least once before it is parked: when the reconciler was down for the whole
window (found by a 500-task chaos run: 16 submits parked without a single lookup, their slots held, and the
tenant's 298 other tasks starved), its first pass asks the provider instead of parking on the clock alone."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import alerts, generation_tasks, task_attempts
from tests.support.flow import create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def test_a_submit_unknown_past_the_park_window_is_looked_up_before_it_is_parked(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=61, faults="ambiguous=1", job_seconds=3000) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        (task_id,) = create_tasks(ctx, 1)
        assert ctx.dispatcher.run_once(max_picks=1) == 1
        Pump(ctx, stop_at_fetch=True).run()  # the submit: the job is made, its answer lost
        with ctx.engine.connect() as conn:
            (attempt,) = conn.execute(sa.select(task_attempts).where(task_attempts.c.task_id == task_id)).all()
        assert attempt.submit_state == "UNKNOWN" and attempt.lookup_count == 0
        ctx.clock.advance(ctx.settings.reconcile.park_after_s + 60)  # type: ignore[attr-defined]
        assert ctx.sync.reconcile_one(attempt.id) == "found"
        with ctx.engine.connect() as conn:
            state = conn.execute(sa.select(task_attempts.c.submit_state).where(task_attempts.c.id == attempt.id))
            task = conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()
            raised = conn.execute(sa.select(sa.func.count()).select_from(alerts)).scalar_one()
        assert state.scalar_one() == "ACKED"
        assert task.status == "SUBMITTED" and task.parked_reason is None and raised == 0
        assert len(sim.truth()["jobs"]) == 1  # found, not submitted again
        ctx.close()
