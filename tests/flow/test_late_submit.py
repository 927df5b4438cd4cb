"""A submit can be late, never unaccounted: a worker that stalls between committing the SENDING claim and the
vendor call while the rest of the engine moves on (the sweeper makes the attempt ambiguous, the lookup finds
nothing, the attempt is closed as never created, attempt 2 is submitted and succeeds).

The stalled worker runs in a thread of its own, held at a failpoint; the test drives everything else with both
clocks under its control, then lets the worker go. The sim's ground truth is the vendor's own list of jobs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import alerts, credit_ledger, generation_tasks, outbox_events, task_attempts
from aivedio_engine.domain.status import EventSource
from aivedio_engine.providers.base import Accepted, GenerationRequest, JobStatus, Observation
from aivedio_engine.services import late_jobs, observations
from aivedio_engine.services.invoice import InvoiceLine
from aivedio_engine.services.operations import Operation
from aivedio_engine.testing import failpoints
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle, running_sim

#: the issue's stall: well past the sweeper's grace, so the attempt is ambiguous before the worker wakes up
STALL_S = 100


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


class StalledWorker:
    """`ctx.submitter.submit(attempt)` in a thread that stops at `point` until `release()`; later hits of the
    point (attempt 2's submit, on the test's thread) pass straight through."""

    def __init__(self, ctx: AppContext, attempt_id: Any, point: str) -> None:
        self._held, self._go = threading.Event(), threading.Event()
        self.outcome: str | None = None
        self.error: BaseException | None = None

        def hold() -> None:
            if threading.get_ident() == self._thread.ident:
                self._held.set()
                assert self._go.wait(30), "the test never released the stalled worker"

        def run() -> None:
            try:
                self.outcome = ctx.submitter.submit(attempt_id)
            except BaseException as exc:  # noqa: BLE001 - what a worker's actor would dead-letter
                self.error = exc

        failpoints.enable(point, hold)
        self._thread = threading.Thread(target=run, name="stalled-worker", daemon=True)
        self._thread.start()
        assert self._held.wait(30), "the worker never reached the failpoint"

    def release(self) -> None:
        self._go.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def _attempts(ctx: AppContext, task_id: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        q = sa.select(task_attempts).where(task_attempts.c.task_id == task_id).order_by(task_attempts.c.attempt_no)
        return list(conn.execute(q).all())


def _ledger(ctx: AppContext, task_id: Any) -> list[tuple[str, Decimal]]:
    with ctx.engine.connect() as conn:
        q = sa.select(credit_ledger.c.entry_type, credit_ledger.c.amount).where(credit_ledger.c.task_id == task_id)
        return [(r.entry_type, Decimal(r.amount)) for r in conn.execute(q.order_by(credit_ledger.c.id))]


def _status(ctx: AppContext, task_id: Any) -> str:
    with ctx.engine.connect() as conn:
        return str(conn.execute(sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)).scalar())


def _stall_then_finish(
    ctx: AppContext, sim: SimHandle, point: str, stall_s: int = STALL_S
) -> tuple[Any, StalledWorker, Driver]:
    (task_id,) = create_tasks(ctx, 1)
    assert ctx.dispatcher.run_once(max_picks=1) == 1
    (first,) = _attempts(ctx, task_id)
    worker = StalledWorker(ctx, first.id, point)
    drv = Driver(ctx, sim, Pump(ctx), step_s=5)
    for _ in range(stall_s // 5):  # the stall: everything but the worker goes on
        drv.round()
    worker.release()
    drv.run_until(lambda: drv.all_in("SUCCEEDED", "FAILED", "CANCELED", "EXPIRED"), max_rounds=300)
    return task_id, worker, drv


def test_a_send_stalled_past_the_send_deadline_is_refused_and_attempt_2_is_the_only_job(
    tmp_path: Path, pg_url: str
) -> None:
    with running_sim(seed=3, job_seconds=10) as sim:
        # the grace the issue ran with; the sim's timeouts plus the default send deadline fit below it
        ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
        try:
            task_id, worker, _ = _stall_then_finish(ctx, sim, "submit.before_call")
            assert _status(ctx, task_id) == "SUCCEEDED"
            assert list(sim.jobs_per_task(ctx.engine).values()) == [1], sim.truth()["jobs"]
            assert worker.error is None, repr(worker.error)
            assert worker.outcome == "refused:late"
            first, second = _attempts(ctx, task_id)
            assert first.submit_state == "FAILED_BEFORE_ACCEPT" and first.provider_job_id is None
            assert second.submit_state == "SUCCEEDED"
            assert [e for e, _ in _ledger(ctx, task_id)] == ["RESERVE", "SETTLE"]
            with ctx.engine.connect() as conn:
                raised = {r.rule for r in conn.execute(sa.select(alerts.c.rule))}
            assert "duplicate_paid_job" not in raised
        finally:
            ctx.close()


#: past every bound the reconciler keeps (the sim's send bound plus the visibility lag, the 300 s lookup): the
#: attempt is closed as never created and attempt 2 is under way when the frozen call goes out
FROZEN_S = 330


def _audit_i35(ctx: AppContext, tmp_path: Path, sim: SimHandle) -> Any:
    """`aivedio audit --check I3.5 --vendor-jobs <the sim's jobs>` on the test's database."""
    listing = tmp_path / "vendor-jobs.csv"
    rows = ["provider,job_id,request_key"] + [f"sim,{j['id']},{j['request_key']}" for j in sim.truth()["jobs"]]
    listing.write_text("\n".join(rows) + "\n")
    sets = [f"data_dir={tmp_path / 'cli'}", f"database.url={ctx.settings.database.url}"]
    args = [a for v in sets for a in ("--set", v)]
    return CliRunner().invoke(app, [*args, "audit", "--json", "--check", "I3.5", "--vendor-jobs", str(listing)])


def test_a_late_send_that_reaches_the_vendor_is_recorded_cancelled_booked_and_alerted(
    tmp_path: Path, pg_url: str
) -> None:
    with running_sim(seed=3, job_seconds=10) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
        try:
            task_id, worker, drv = _stall_then_finish(ctx, sim, "submit.after_deadline_check", FROZEN_S)
            assert worker.error is None, repr(worker.error)  # nothing dead-lettered
            assert worker.outcome == "duplicate"
            drv.pump.run()  # the cancel the late answer asked for, when the task was done already
            assert _status(ctx, task_id) == "SUCCEEDED"
            assert list(sim.jobs_per_task(ctx.engine).values()) == [2]
            first, second = _attempts(ctx, task_id)
            late = {j["request_key"]: j for j in sim.truth()["jobs"]}[first.provider_request_key]
            assert first.submit_state == "FAILED_BEFORE_ACCEPT" and first.provider_job_id == late["id"]
            assert late["canceled"] and second.submit_state == "SUCCEEDED"
            assert sim.truth()["calls"]["cancel"] == 1 and _duplicate_alert(ctx).details["cancel"] == "canceled"
            with ctx.engine.connect() as conn:
                cost = conn.execute(
                    sa.select(credit_ledger).where(
                        credit_ledger.c.task_id == task_id, credit_ledger.c.entry_type == "ADJUSTMENT"
                    )
                ).one()
                raised = conn.execute(sa.select(alerts).where(alerts.c.rule == "duplicate_paid_job")).one()
            assert cost.attempt_id == first.id and Decimal(cost.amount) == 0
            assert Decimal(cost.vendor_amount) == Decimal(2)  # the price list's 2 s x 1 credit
            assert late["id"] in raised.message
            assert [e for e, _ in _ledger(ctx, task_id)] == ["RESERVE", "SETTLE", "ADJUSTMENT"]
            result = _audit_i35(ctx, tmp_path, sim)
            assert result.exit_code == 0, result.output
            # the invoice bills both jobs at the charge: the duplicate is booked already, never a second row
            invoice = [
                InvoiceLine(i + 2, "sim", j["id"], Decimal(2), None, datetime.now(UTC), j["request_key"])
                for i, j in enumerate(sim.truth()["jobs"])
            ]
            report = ctx.ledger_ops.reconcile(invoice, op=Operation("ledger reconcile", "the late send's invoice"))
            (finding,) = [f for f in report.findings if f.line.job_id == late["id"]]
            assert (finding.kind, finding.booking) == ("duplicate_job", "already_booked")
            assert [e for e, _ in _ledger(ctx, task_id)] == ["RESERVE", "SETTLE", "ADJUSTMENT"]
        finally:
            ctx.close()


def test_an_unrecorded_late_job_is_flagged_by_the_audit(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(late_jobs, "record", lambda *a, **kw: False)  # the recording suppressed
    with running_sim(seed=3, job_seconds=10) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
        try:
            task_id, worker, _ = _stall_then_finish(ctx, sim, "submit.after_deadline_check", FROZEN_S)
            assert worker.error is None and list(sim.jobs_per_task(ctx.engine).values()) == [2]
            first, _ = _attempts(ctx, task_id)
            late = {j["request_key"]: j for j in sim.truth()["jobs"]}[first.provider_request_key]
            result = _audit_i35(ctx, tmp_path, sim)
            assert result.exit_code == 1, result.output
            (check,) = json.loads(result.stdout)["checks"]
            assert check["id"] == "I3.5" and check["status"] == "violated"
            assert [(r["job_id"], r["task_id"]) for r in check["rows"]] == [(late["id"], str(task_id))]
        finally:
            ctx.close()


def test_a_status_naming_a_closed_attempts_request_key_records_the_duplicate_and_moves_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    """The late job's first news may be its callback, before (or instead of) the late send's answer."""
    with running_sim(seed=3, job_seconds=10) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
        try:
            task_id, worker, drv = _stall_then_finish(ctx, sim, "submit.before_call")
            assert worker.outcome == "refused:late" and _status(ctx, task_id) == "SUCCEEDED"
            first, second = _attempts(ctx, task_id)
            for status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):  # a second callback is only recorded
                with write_tx(ctx.engine) as conn:
                    obs = Observation(
                        job_id="job_late", status=status, request_key=first.provider_request_key, event_id=status
                    )
                    assert observations.record(conn, "sim", obs, EventSource.CALLBACK, ctx.clock.now())
                drv.pump.run()
            first, again = _attempts(ctx, task_id)
            assert (first.submit_state, first.provider_job_id) == ("FAILED_BEFORE_ACCEPT", "job_late")
            assert again.submit_state == "SUCCEEDED" and _status(ctx, task_id) == "SUCCEEDED"
            assert [e for e, _ in _ledger(ctx, task_id)] == ["RESERVE", "SETTLE", "ADJUSTMENT"]
            with ctx.engine.connect() as conn:
                (raised,) = conn.execute(sa.select(alerts).where(alerts.c.rule == "duplicate_paid_job")).all()
                dead = conn.execute(
                    sa.select(sa.func.count()).select_from(outbox_events).where(outbox_events.c.status == "DEAD")
                ).scalar_one()
            assert "job_late" in raised.message and dead == 0
        finally:
            ctx.close()


def _duplicate_alert(ctx: AppContext) -> Any:
    with ctx.engine.connect() as conn:
        (raised,) = conn.execute(sa.select(alerts).where(alerts.c.rule == "duplicate_paid_job")).all()
    return raised


def test_a_late_job_first_seen_in_a_callback_is_cancelled_at_the_vendor_once(tmp_path: Path, pg_url: str) -> None:
    """The late send's answer is lost (the worker died with it): the job's callback is all the engine hears of
    it, and the reducer holds no adapter. Its cancel is a message of its own, delivered twice here."""
    with running_sim(seed=3, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
        try:
            task_id, worker, drv = _stall_then_finish(ctx, sim, "submit.before_call")
            assert worker.outcome == "refused:late" and _status(ctx, task_id) == "SUCCEEDED"
            first, _ = _attempts(ctx, task_id)
            # what the frozen request made at the vendor, with the closed attempt's request key
            request = GenerationRequest("scene 0", "sim-v1", 2, "720p", "16:9")
            made = ctx.providers["sim"].submit(request, first.provider_request_key)
            assert isinstance(made, Accepted)
            sim.advance(5)
            with write_tx(ctx.engine) as conn:
                obs = Observation(
                    job_id=made.job_id, status=JobStatus.RUNNING, request_key=first.provider_request_key, event_id="r"
                )
                assert observations.record(conn, "sim", obs, EventSource.CALLBACK, ctx.clock.now())
            Pump(ctx, duplicate_every=1).run()  # every message delivered twice, as a redelivering broker may
            truth = sim.truth()
            late = {j["id"]: j for j in truth["jobs"]}[made.job_id]
            assert late["canceled"] and late["status"] == "canceled"
            assert truth["calls"]["cancel"] == 1
            raised = _duplicate_alert(ctx)
            assert raised.details["job_id"] == made.job_id and raised.details["cancel"] == "canceled"
            first, second = _attempts(ctx, task_id)
            assert (first.submit_state, first.provider_job_id) == ("FAILED_BEFORE_ACCEPT", made.job_id)
            assert second.submit_state == "SUCCEEDED" and _status(ctx, task_id) == "SUCCEEDED"
        finally:
            ctx.close()
