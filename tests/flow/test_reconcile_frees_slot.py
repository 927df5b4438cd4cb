"""A submit the provider confirms it never created frees its slot in the reconciliation's own commit. Before,
`ProviderSync` was built without the slot store: the attempt ended but its slot stayed held until the slot
reconciler's next pass, so for that long the tenant (and the platform) had one slot fewer."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import task_attempts
from tests.support.flow import create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def test_a_submit_confirmed_not_created_frees_its_slot_at_once(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=62, faults="reset=1", job_seconds=3000) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        (task_id,) = create_tasks(ctx, 1)
        assert ctx.dispatcher.run_once(max_picks=1) == 1
        Pump(ctx, stop_at_fetch=True).run()  # the submit: the connection drops and no job is made
        with ctx.engine.connect() as conn:
            (attempt,) = conn.execute(sa.select(task_attempts).where(task_attempts.c.task_id == task_id)).all()
        assert attempt.submit_state == "UNKNOWN"
        assert sum(ctx.slots.counts().values()) > 0  # the ambiguous attempt holds its slot
        ctx.clock.advance(ctx.settings.reconcile.visibility_lag_s + 60)  # type: ignore[attr-defined]
        assert ctx.sync.reconcile_one(attempt.id) == "not-created"
        with ctx.engine.connect() as conn:
            state = conn.execute(sa.select(task_attempts.c.submit_state).where(task_attempts.c.id == attempt.id))
            assert state.scalar_one() == "FAILED_BEFORE_ACCEPT"
        assert sum(ctx.slots.counts().values()) == 0
        assert sim.truth()["jobs"] == []  # nothing was made, nothing was sent again
        ctx.close()
