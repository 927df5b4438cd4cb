"""A request for n outputs through the sim on real PostgreSQL, the whole pipeline (issue 10 item 8): submit, polls,
the fetch of every output, one media run per output with its own retries, SUCCEEDED once every output is
playable, and a settlement that counts the outputs the vendor billed.

sim-v1 at 720p costs 1 credit per second; every task asks for 2 s and 2 outputs, so 4 credits are reserved."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.config import ModelSettings
from aivedio_engine.db.tables import alerts, assets, credit_ledger, generation_tasks, outbox_events, task_attempts
from aivedio_engine.services import media as media_module
from aivedio_engine.services.follow_on import MediaProcessRequested
from aivedio_engine.services.invariants import InvariantService
from aivedio_engine.services.operations import Operation
from tests.support.app import tenant_with_key
from tests.support.balance import balance_of
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

D = Decimal
SIM_V1 = ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": 1}, max_outputs=2)
REQUIRED = {"proxy_mp4", "hls", "thumbnail"}


def _context(tmp_path: Path, sim: Any, pg_url: str) -> AppContext:
    return sim_context(
        tmp_path,
        sim,
        pg_url,
        provider={"models": {"sim-v1": SIM_V1}},
        retry={"media": {"max_attempts": 3, "base_delay_s": 5, "max_delay_s": 5}},
    )


def _create(ctx: AppContext, tenant_id: Any, key: str) -> Any:
    body = {"prompt": "two takes of a fox", "model": "sim-v1", "duration_s": 2, "n": 2}
    return ctx.generations.create(tenant_id, key, body).task.id


def _task(ctx: AppContext, task_id: Any) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()


def _ledger(ctx: AppContext, task_id: Any) -> dict[str, Decimal]:
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(credit_ledger).where(credit_ledger.c.task_id == task_id)).all()
    out: dict[str, Decimal] = {}
    for r in rows:
        out[r.entry_type] = out.get(r.entry_type, D(0)) + D(r.amount)
    return out


def _ready_by_output(ctx: AppContext, task_id: Any) -> dict[int, set[str]]:
    """Each raw output's index → the profiles of its READY derivatives."""
    a = assets.c
    with ctx.engine.connect() as conn:
        raws = {
            r.id: r.output_index
            for r in conn.execute(sa.select(a.id, a.output_index).where(a.task_id == task_id, a.kind == "RAW_OUTPUT"))
        }
        ready = conn.execute(
            sa.select(a.parent_asset_id, a.profile).where(a.parent_asset_id.in_(list(raws)), a.status == "READY")
        ).all()
    out: dict[int, set[str]] = {i: set() for i in raws.values()}
    for row in ready:
        out[raws[row.parent_asset_id]].add(row.profile)
    return out


def _balance(ctx: AppContext, tenant_id: Any) -> Decimal:
    with ctx.engine.connect() as conn:
        return balance_of(conn, tenant_id)


def _audit_clean(ctx: AppContext) -> None:
    report = InvariantService(ctx.engine, ctx.clock).run(only=["I4.1", "I4.2", "I4.3", "I4.4", "I4.6", "I4.8", "I4.9"])
    assert [(r.id, r.rows) for r in report.results if not r.ok] == []


def test_every_output_is_fetched_processed_and_shown(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=61, job_seconds=4) as sim:
        ctx = _context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", credits=100)
        tid = _create(ctx, who.tenant_id, "two")
        Driver(ctx, sim, Pump(ctx), step_s=3).run_until(lambda: _task(ctx, tid).status == "SUCCEEDED", 60)

        ready = _ready_by_output(ctx, tid)
        assert sorted(ready) == [0, 1] and all(REQUIRED <= p for p in ready.values()), ready
        variants = ctx.outputs.variants(who.tenant_id, tid)
        assert [v.index for v in variants] == [0, 1]
        assert variants[0].files.keys() == ctx.outputs.files(who.tenant_id, tid).keys()
        assert variants[0].files["proxy_mp4"].key != variants[1].files["proxy_mp4"].key
        # both outputs billed (the sim reports billed_outputs = n): the whole reservation is charged
        with ctx.engine.connect() as conn:
            billed = conn.execute(sa.select(task_attempts.c.billed_outputs).where(task_attempts.c.task_id == tid))
            assert billed.scalar_one() == 2
        assert _ledger(ctx, tid) == {"RESERVE": D(-4), "SETTLE": D(0)}
        assert _balance(ctx, who.tenant_id) == D(96)
        _audit_clean(ctx)
        ctx.close()


def test_one_billed_output_of_two_charges_half(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=62, job_seconds=4) as sim:
        sim.configure(billed_outputs=1)  # the vendor bills one of the two outputs it delivered
        ctx = _context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", credits=100)
        tid = _create(ctx, who.tenant_id, "half")
        Driver(ctx, sim, Pump(ctx), step_s=3).run_until(lambda: _task(ctx, tid).status == "SUCCEEDED", 60)

        assert D(_task(ctx, tid).estimated_cost) == D(4)
        assert _ledger(ctx, tid) == {"RESERVE": D(-4), "SETTLE": D(2)}  # 2 of the 4 reserved come back
        assert D(_task(ctx, tid).actual_cost) == D(2)
        assert _balance(ctx, who.tenant_id) == D(98)
        _audit_clean(ctx)
        ctx.close()


def test_a_retryable_media_failure_of_one_output_waits_and_then_succeeds(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[int] = []
    real = media_module.MediaService._process

    def flaky(self: Any, task: Any, raw: Any, limits: Any) -> media_module.Outcome:
        runs.append(raw.output_index)
        if raw.output_index == 1 and runs.count(1) == 1:  # output 1's first run: ffprobe is missing for a moment
            return media_module.Outcome(unavailable="ffprobe not found")
        return real(self, task, raw, limits)

    monkeypatch.setattr(media_module.MediaService, "_process", flaky)
    with running_sim(seed=63, job_seconds=4) as sim:
        ctx = _context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", credits=100)
        tid = _create(ctx, who.tenant_id, "flaky")
        drv = Driver(ctx, sim, Pump(ctx), step_s=3)
        drv.run_until(lambda: sorted(runs) == [0, 1], 60)

        # output 0 is playable, output 1 waits for its retry: the task is neither done nor failed
        task = _task(ctx, tid)
        assert task.status == "POST_PROCESSING"
        assert task.last_error_class == "media_worker_crashed"
        ready = _ready_by_output(ctx, tid)
        assert REQUIRED <= ready[0] and not REQUIRED <= ready[1], ready
        with ctx.engine.connect() as conn:
            retry = conn.execute(
                sa.select(outbox_events.c.payload).where(
                    outbox_events.c.aggregate_id == tid,
                    outbox_events.c.event_type == "media.process.requested",
                    outbox_events.c.status == "PENDING",
                )
            ).scalar_one()
        assert retry["try"] == 2
        assert _ledger(ctx, tid) == {"RESERVE": D(-4)}

        drv.run_until(lambda: _task(ctx, tid).status == "SUCCEEDED", 60)
        assert runs.count(1) == 2 and runs.count(0) == 1  # only the failed output ran again
        ready = _ready_by_output(ctx, tid)
        assert all(REQUIRED <= p for p in ready.values()), ready
        assert _ledger(ctx, tid) == {"RESERVE": D(-4), "SETTLE": D(0)}
        _audit_clean(ctx)
        ctx.close()


def test_the_sweeper_redrives_only_the_output_whose_message_was_lost(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[bool, bool]] = []  # (is output 0, redriven) of every media message handled
    real = media_module.MediaService.handle
    with running_sim(seed=64, job_seconds=4) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            provider={"models": {"sim-v1": SIM_V1}},
            sweeper={"fetch_stuck_s": 10, "media_stuck_s": 10},
        )
        who = tenant_with_key(ctx, "acme", credits=100)
        tid = _create(ctx, who.tenant_id, "lost")

        def lossy(self: Any, envelope: Any) -> str:
            request = MediaProcessRequested.parse(envelope.payload)
            first = request.asset_id == _task(ctx, tid).output_asset_id
            seen.append((first, request.redriven))
            if not first and not request.redriven:
                return "lost"  # output 1's message vanishes: a crash before the consumer's commit
            return real(self, envelope)

        monkeypatch.setattr(media_module.MediaService, "handle", lossy)
        Driver(ctx, sim, Pump(ctx), step_s=3).run_until(lambda: _task(ctx, tid).status == "SUCCEEDED", 60)

        assert sorted(seen) == [(False, False), (False, True), (True, False)]  # output 0 was never re-run
        ready = _ready_by_output(ctx, tid)
        assert all(REQUIRED <= p for p in ready.values()), ready
        ctx.close()


def test_a_variant_made_and_billed_but_never_playable_is_not_charged_to_the_tenant(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two outputs made and billed; output 1 never becomes playable (media past its budget holds the task for a
    person), and the reviewer approves what there is. The tenant pays for the one delivered output; the other is
    platform cost (a 0-credit ADJUSTMENT carrying its price) with an alert, and the audit agrees."""
    real = media_module.MediaService._process

    def output_one_broken(self: Any, task: Any, raw: Any, limits: Any) -> media_module.Outcome:
        if raw.output_index == 1:
            return media_module.Outcome(unavailable="ffprobe not found")
        return real(self, task, raw, limits)

    monkeypatch.setattr(media_module.MediaService, "_process", output_one_broken)
    with running_sim(seed=64, job_seconds=4) as sim:
        ctx = _context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", credits=100)
        tid = _create(ctx, who.tenant_id, "one-of-two")
        drv = Driver(ctx, sim, Pump(ctx), step_s=3)
        drv.run_until(lambda: _task(ctx, tid).status == "MANUAL_REVIEW", 80)
        assert _ledger(ctx, tid) == {"RESERVE": D(-4)}

        decided = ctx.review.approve(tid, "rita", Operation("review approve", "output 0 is fine"))
        assert decided.task_status == "SUCCEEDED"
        assert _ledger(ctx, tid) == {"RESERVE": D(-4), "SETTLE": D(2), "ADJUSTMENT": D(0)}
        assert D(_task(ctx, tid).actual_cost) == D(2)  # estimate ÷ n × 1 delivered
        assert _balance(ctx, who.tenant_id) == D(98)
        with ctx.engine.connect() as conn:
            (platform,) = conn.execute(
                sa.select(credit_ledger.c.vendor_amount).where(
                    credit_ledger.c.task_id == tid, credit_ledger.c.entry_type == "ADJUSTMENT"
                )
            ).scalars()
            rules = conn.execute(sa.select(alerts.c.rule).where(alerts.c.subject_id == str(tid))).scalars().all()
        assert D(platform) == D(2) and "platform_cost" in rules
        _audit_clean(ctx)
        ctx.close()
