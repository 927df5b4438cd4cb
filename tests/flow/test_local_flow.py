"""A generation through the real local provider (ffmpeg) in embedded mode: submit, report or poll, fetch, media,
settle. The provider reports a job's end itself (`CallbackService.report`, a provider_events row with source
`callback`); polling stays the fallback when that report is lost."""

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
    provider_events,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.providers.base import QueryFailed
from aivedio_engine.services.sync import ProviderSync
from aivedio_engine.testing import failpoints
from tests.support.app import make_context, tenant_with_key
from tests.support.pump import Pump


def _sources(ctx) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(provider_events.c.source, provider_events.c.observation)).all()
    return [(r.source, r.observation["status"]) for r in rows]


def test_local_job_end_is_reported_directly_and_completes_the_task_without_a_poll(tmp_path: Path) -> None:
    # polls are a minute apart: a task done in seconds was not completed by one
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 60, "max_interval_s": 60, "jitter": 0})
    try:
        who = tenant_with_key(ctx, "alice", credits=100)
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a paper boat", "model": "local-v1", "duration_s": 1})
        polled = {o: _polls("local", o) for o in ("observed", "failed")}
        pump = Pump(ctx)
        assert ctx.dispatcher.run_once() == 1
        pump.run()  # submit: the render starts on the provider's own thread
        deadline = time.monotonic() + 60
        done = threading.Event()
        while time.monotonic() < deadline and ("callback", "succeeded") not in _sources(ctx):
            done.wait(0.1)  # bounded wait for the render thread's report
        assert ("callback", "succeeded") in _sources(ctx), _sources(ctx)
        pump.run()  # reducer → fetch (+ media in the same run) → notifications
        with ctx.engine.connect() as conn:
            task = conn.execute(sa.select(generation_tasks)).one()
            attempt = conn.execute(sa.select(task_attempts)).one()
        assert task.status == "SUCCEEDED"
        assert attempt.poll_count == 0  # no poll fired
        assert {source for source, _ in _sources(ctx)} == {"callback"}
        assert {o: _polls("local", o) for o in ("observed", "failed")} == polled
        with ctx.engine.connect() as conn:
            keys = {r[0] for r in conn.execute(sa.select(provider_events.c.dedup_key))}
        # the report's own id, not the fingerprint a poll of the same state would have (next test)
        assert {k.rsplit(":", 1)[-1] for k in keys} >= {"succeeded"} and all(k.startswith("wh:report:") for k in keys)
        assert pump.seen["provider.status.observed"] >= 1 and pump.seen["media.process.requested"] == 0
    finally:
        ctx.close()


def test_local_provider_drives_a_task_to_succeeded_by_polls_when_its_report_is_lost(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data", polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    failpoints.configure("callback.report=raise")  # the direct report fails (a database hiccup): logged, lost
    try:
        _drive_by_polls(ctx)
        assert failpoints.hits("callback.report") >= 1  # the report was tried
        assert {source for source, _ in _sources(ctx)} == {"polling"}
    finally:
        failpoints.reset()
        ctx.close()


def _drive_by_polls(ctx) -> None:  # type: ignore[no-untyped-def]
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
    # the clip is small: the fetch run went straight on to the media step (no media message)
    assert pump.seen["fetch.requested"] == 1 and pump.seen["media.process.requested"] == 0
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


def _polls(provider: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("aivedio_provider_polls_total", {"provider": provider, "outcome": outcome}) or 0.0


def test_polls_are_counted_by_outcome_and_their_observations_carry_the_task_trace(tmp_path: Path) -> None:
    """polling_qps and polling_error_rate come from one counter; a failed query changes
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


def test_a_direct_report_does_not_hide_the_polled_observation_of_the_same_state(tmp_path: Path) -> None:
    """A report the reducer could not use yet (it raced the submit's own commit) must leave the poll able to
    deliver the same state: the report carries its own event id, the poll is deduplicated by its fingerprint."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from aivedio_engine.db.session import write_tx
    from aivedio_engine.domain.status import EventSource
    from aivedio_engine.providers.base import JobStatus, Observation
    from aivedio_engine.services import observations

    ctx = make_context(tmp_path / "data")
    try:
        polled = Observation(
            job_id="loc_" + "0" * 32,
            status=JobStatus.SUCCEEDED,
            provider_updated_at=datetime(2026, 1, 1, tzinfo=UTC),
            progress=100,
            request_key="avd-test",
        )
        reported = replace(polled, event_id=f"report:{polled.job_id}:succeeded")
        assert ctx.callbacks.report("local", reported) is True
        assert ctx.callbacks.report("local", reported) is False  # a repeated report is stored once
        with write_tx(ctx.engine) as conn:
            assert observations.record(conn, "local", polled, EventSource.POLLING, ctx.clock.now()) is True
        assert sorted(_sources(ctx)) == [("callback", "succeeded"), ("polling", "succeeded")]
    finally:
        ctx.close()
