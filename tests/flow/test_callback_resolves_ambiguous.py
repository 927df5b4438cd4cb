"""A vendor without lookup by request key still resolves an ambiguous submit when its own status callback carries
our request key: the callback proves the job exists, so the task continues instead of staying parked while
the job runs and is billed."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.db.tables import alerts, task_attempts, task_state_events
from tests.support.app import running_api
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim


def test_a_callback_with_our_request_key_binds_the_ambiguous_job(tmp_path: Path) -> None:
    with running_sim(seed=41, faults="ambiguous=1", job_seconds=6, lookup=False) as sim:
        ctx = sim_context(tmp_path, sim, provider={"supports_lookup_by_request_key": False})
        with running_api(ctx) as base:
            sim.configure(webhook_url=f"{base}/v1/callbacks/sim")
            create_tasks(ctx, 5)
            drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=3, callbacks=True)
            drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"), max_rounds=40)
        truth = sim.truth()
        with ctx.engine.connect() as conn:
            via_callback = conn.execute(
                sa.select(sa.func.count())
                .select_from(task_state_events)
                .where(task_state_events.c.event_type == "provider_job_found", task_state_events.c.source == "callback")
            ).scalar_one()
            resubmits = conn.execute(
                sa.select(sa.func.count()).select_from(task_attempts).where(task_attempts.c.resubmitted_after_unknown)
            ).scalar_one()
            parked = conn.execute(sa.select(sa.func.count()).select_from(alerts)).scalar_one()
        assert via_callback == 5  # every ambiguous submit was resolved by the vendor's own callback
        assert resubmits == 0 and truth["duplicate_paid_jobs"] == 0 and len(truth["jobs"]) == 5
        assert parked == 0
        ctx.close()
