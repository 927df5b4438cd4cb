"""`[retry.query]` governs the poller: a job whose queries fail is queried again on the budget's backoff, an alert
is raised when the budget is spent (polling goes on, slowly), and an answer ends the streak."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.tables import alerts, task_attempts
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.providers.base import Accepted, Capabilities, JobStatus, Observation, QueryFailed
from aivedio_engine.services.submit import SubmitService
from aivedio_engine.services.sync import ProviderSync
from tests.support.app import FakeClock, make_context, tenant_with_key

CAPS = Capabilities(
    models=("local-v1",),
    max_duration_s=10,
    resolutions=("360p", "720p"),
    supports_callbacks=False,
    supports_lookup_by_request_key=True,
    supports_cancel=True,
    output_url_ttl_s=3600,
)


class Vendor:
    """Accepts every submit; its status endpoint is down until `up` is set."""

    name = "local"
    capabilities = CAPS

    def __init__(self) -> None:
        self.up = False
        self.queries = 0

    def submit(self, request: Any, request_key: str) -> Accepted:
        return Accepted("job-1")

    def query(self, job_id: str) -> QueryFailed | Observation:
        self.queries += 1
        if not self.up:
            return QueryFailed(ErrorClass.QUERY_FAILED, "bad gateway")
        return Observation(job_id=job_id, status=JobStatus.RUNNING)


def _attempt(ctx: Any) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(task_attempts)).one()


def _alerts(ctx: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(alerts).where(alerts.c.rule == "query_budget_spent")).all()


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def test_failed_polls_back_off_by_the_query_budget_and_alert_when_it_is_spent(tmp_path: Path) -> None:
    budget = {"max_attempts": 4, "base_delay_s": 20, "multiplier": 2, "max_delay_s": 60, "max_total_wait_s": 5000}
    ctx = make_context(
        tmp_path / "data",
        clock=FakeClock(),
        polling={"min_interval_s": 2, "max_interval_s": 300, "jitter": 0},
        retry={"query": budget},
    )
    try:
        who = tenant_with_key(ctx, "poller", credits=100)
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a lantern", "model": "local-v1", "duration_s": 2})
        assert ctx.dispatcher.run_once() == 1
        vendor = Vendor()
        SubmitService(ctx.engine, ctx.clock, ctx.settings, {"local": vendor}).submit(_attempt(ctx).id)
        sync = ProviderSync(ctx.engine, ctx.clock, ctx.settings, {"local": vendor}, rng=random.Random(7))

        delays = []
        for n in range(1, 5):
            due = _attempt(ctx).next_poll_at
            ctx.clock.advance(max(0.0, (_aware(due) - ctx.clock.now()).total_seconds()))  # type: ignore[attr-defined]
            assert sync.poll_due() == 1
            after = _attempt(ctx)
            delays.append((_aware(after.next_poll_at) - ctx.clock.now()).total_seconds())
            assert after.provider_error_code.startswith(f"query_failed;n={n};")
            assert after.submit_state == "ACKED"  # a failed query never changes a state
            assert bool(_alerts(ctx)) == (n == 4)
        # failures 1-3 within the budget: full-jitter backoff capped at 20, 40, 60 s, never under the 2 s floor
        for delay, cap in zip(delays[:3], (20, 40, 60), strict=True):
            assert 2 <= delay <= cap, delays
        # the 4th failure spends the budget: an alert, and the job is still polled, at the slowest interval
        assert delays[3] == 300, delays
        (alert,) = _alerts(ctx)
        assert "4/4 attempts" in alert.message and alert.subject_id == str(_attempt(ctx).id)

        vendor.up = True
        ctx.clock.advance(300)  # type: ignore[attr-defined]
        assert sync.poll_due() == 1
        assert _attempt(ctx).provider_error_code is None  # it answered: the streak is over
        assert vendor.queries == 5
    finally:
        ctx.close()
