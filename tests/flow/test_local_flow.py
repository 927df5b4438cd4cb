"""A generation through the real local provider (ffmpeg) in embedded mode: submit, poll, fetch, media, settle."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import sqlalchemy as sa
from prometheus_client import REGISTRY

from aivedio_engine.db.tables import (
    assets,
    credit_ledger,
    generation_tasks,
    outbox_events,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.providers.base import QueryFailed
from aivedio_engine.services.sync import ProviderSync
from tests.support.app import make_context, tenant_with_key
from tests.support.pump import Pump


def test_local_provider_drives_a_task_to_succeeded(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    who = tenant_with_key(ctx, "alice", credits=100)
    task = ctx.generations.create(
        who.tenant_id, "k1", {"prompt": "a paper boat", "model": "local-v1", "duration_s": 2}
    ).task
    pump = Pump(ctx)
    assert ctx.dispatcher.run_once() == 1
    pump.run()
    deadline = time.monotonic() + 60
    woke = threading.Event()
    status = None
    while time.monotonic() < deadline:
        # the poll is due ≥ 1 s after submit; force it due instead of waiting for the schedule
        with ctx.engine.begin() as conn:
            conn.execute(task_attempts.update().values(next_poll_at=ctx.clock.now()))
        ctx.sync.poll_due()
        pump.run()
        with ctx.engine.connect() as conn:
            status = conn.execute(sa.select(generation_tasks.c.status)).scalar_one()
        if status == "SUCCEEDED":
            break
        woke.wait(0.2)  # bounded wait for the render to progress before the next poll
    assert status == "SUCCEEDED", status
    assert pump.seen["fetch.requested"] == 1 and pump.seen["media.process.requested"] == 1
    with ctx.engine.connect() as conn:
        history = [
            r.to_status
            for r in conn.execute(
                sa.select(task_state_events.c.to_status)
                .where(task_state_events.c.outcome == "applied")
                .order_by(task_state_events.c.task_version)
            )
        ]
        attempt = conn.execute(sa.select(task_attempts)).one()
        reserves = conn.execute(
            sa.select(sa.func.count()).select_from(credit_ledger).where(credit_ledger.c.entry_type == "RESERVE")
        ).scalar_one()
    assert history[:6] == ["CREATED", "VALIDATING", "QUOTA_RESERVED", "QUEUED", "DISPATCHING", "SUBMITTED"]
    assert history[-3:] == ["OUTPUT_FETCHING", "POST_PROCESSING", "SUCCEEDED"]
    assert attempt.submit_state == "SUCCEEDED" and attempt.provider_job_id
    assert reserves == 1
    with ctx.engine.connect() as conn:
        kinds = {r.kind: r for r in conn.execute(sa.select(assets).where(assets.c.status == "READY"))}
        task = conn.execute(sa.select(generation_tasks)).one()
        ledger = {r.entry_type: r.amount for r in conn.execute(sa.select(credit_ledger))}
    assert {"RAW_OUTPUT", "PROXY", "HLS", "THUMBNAIL", "WAVEFORM"} <= kinds.keys()
    assert kinds["RAW_OUTPUT"].duration_ms and kinds["RAW_OUTPUT"].width
    assert task.output_asset_id == kinds["RAW_OUTPUT"].id and task.reserved_amount == 0
    assert ledger["RESERVE"] + ledger["SETTLE"] == -task.actual_cost  # settled in the success transaction
    assert ctx.slots.counts().get("provider:local", 0) == 0  # the slot came back with the finished attempt
    ctx.close()


def _polls(provider: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("aivedio_provider_polls_total", {"provider": provider, "outcome": outcome}) or 0.0


def test_polls_are_counted_by_outcome_and_their_observations_carry_the_task_trace(tmp_path: Path) -> None:
    """polling_qps and polling_error_rate (seed 000 §4.10.7) come from one counter; a failed query changes
    nothing but the attempt's schedule."""
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    try:
        who = tenant_with_key(ctx, "alice", credits=100)
        ctx.generations.create(
            who.tenant_id, "k1", {"prompt": "a kite", "model": "local-v1", "duration_s": 2}, trace_id="req-kite"
        )
        assert ctx.dispatcher.run_once() == 1
        Pump(ctx, stop_at_fetch=True).run()

        class Failing:
            def query(self, job_id: str) -> QueryFailed:
                return QueryFailed(ErrorClass.QUERY_FAILED, "bad gateway")

        before = {o: _polls("local", o) for o in ("observed", "failed")}
        for providers in ({"local": Failing()}, ctx.providers):
            with ctx.engine.begin() as conn:
                conn.execute(task_attempts.update().values(next_poll_at=ctx.clock.now()))
            assert ProviderSync(ctx.engine, ctx.clock, ctx.settings, providers).poll_due() == 1
        with ctx.engine.connect() as conn:
            attempt = conn.execute(sa.select(task_attempts)).one()
        assert _polls("local", "failed") == before["failed"] + 1
        assert _polls("local", "observed") == before["observed"] + 1
        assert attempt.poll_count == 2 and attempt.submit_state in ("ACKED", "RUNNING", "SUCCEEDED")
        with ctx.engine.connect() as conn:
            traces = conn.execute(sa.select(outbox_events.c.event_type, outbox_events.c.trace_id)).all()
        # the observation of the poll carries the request's trace like every other event of the task
        assert "provider.status.observed" in {t.event_type for t in traces}
        assert {t.trace_id for t in traces} == {"req-kite"}, traces
    finally:
        ctx.close()
