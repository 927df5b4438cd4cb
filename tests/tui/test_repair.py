"""Repair screens against real failures: SUBMIT_UNKNOWN from the sim's `ambiguous` fault (the job was created,
the answer lost), reconciled from the TUI; an orphan provider event from a signed callback for a job another
deployment created, replayed from the TUI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from textual.pilot import Pilot
from textual.widgets import DataTable

from aivedio_engine.db.tables import audit_log, generation_tasks, task_attempts
from aivedio_engine.providers.webhooks import sign_webhook
from tests.support.app import tenant_with_key
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SECRET, running_sim
from tests.tui.conftest import OPERATOR, drive, make_app, press, rows, type_text
from tui.screens.overview import OverviewScreen
from tui.screens.replay import ReplayScreen
from tui.screens.unknown import UnknownScreen
from tui.widgets import ConfirmModal


def _audits(ctx: Any, command: str) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(audit_log).where(audit_log.c.command == command)))


def _status(ctx: Any, task_id: Any) -> str:
    with ctx.engine.connect() as conn:
        return str(
            conn.execute(sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)).scalar_one()
        )


@pytest.mark.postgres
def test_submit_unknown_listed_then_reconciled_now_with_a_reason(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=41, faults="ambiguous=1", job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", 1000)
        ids = [
            ctx.generations.create(
                who.tenant_id, f"k{i}", {"prompt": f"scene {i}", "model": "sim-v1", "duration_s": 2}
            ).task.id
            for i in range(2)
        ]
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=1)
        drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"), max_rounds=5)
        app, toasts = make_app(ctx)

        async def scenario(pilot: Pilot[Any]) -> None:
            overview = app.screen
            assert isinstance(overview, OverviewScreen)
            figures = rows(overview.query_one("#figures", DataTable))
            assert figures["submit_unknown"][1] == "2"  # read on PostgreSQL, under its statement timeout
            assert rows(overview.query_one("#providers", DataTable))["sim"][2] == "2"

            await press(pilot, "4")
            screen = app.screen
            assert isinstance(screen, UnknownScreen)
            table = screen.query_one("#unknown", DataTable)
            assert set(rows(table)) == {str(t) for t in ids}
            assert {r[2] for r in rows(table).values()} == {"SUBMIT_UNKNOWN"}

            await press(pilot, "p")  # the highlighted one only
            modal = app.screen
            assert isinstance(modal, ConfirmModal)
            first = screen.selected_key(table)
            assert first is not None and first in str(modal.query_one("#confirm-lines").render())
            await type_text(pilot, "INC-9 lost submit answers")
            await press(pilot, "enter")
            assert _status(ctx, first) != "SUBMIT_UNKNOWN"
            assert "reconciled: found=1" in toasts.text()
            (audit,) = _audits(ctx, "tui reconcile")
            assert (audit.actor, audit.reason, audit.outcome, audit.affected_ids) == (
                OPERATOR,
                "INC-9 lost submit answers",
                "ok",
                [first],
            )
            assert set(rows(table)) == {str(t) for t in ids} - {first}

            await press(pilot, "P")  # every listed one
            assert "1 task(s) will be looked up" in str(app.screen.query_one("#confirm-lines").render())
            await type_text(pilot, "INC-9 the rest")
            await press(pilot, "enter")
            assert rows(table) == {} and all(_status(ctx, t) != "SUBMIT_UNKNOWN" for t in ids)

        drive(app, scenario)
        with ctx.engine.connect() as conn:
            bound = (
                conn.execute(sa.select(task_attempts.c.provider_job_id).where(task_attempts.c.task_id.in_(ids)))
                .scalars()
                .all()
            )
        assert sorted(bound) == sorted(j["id"] for j in sim.truth()["jobs"])  # the lost jobs, no duplicates
        ctx.close()


@pytest.mark.postgres
def test_a_submit_settled_by_hand_bind_the_console_job_or_declare_it_never_created(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=52, job_seconds=3, lookup=False) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, provider={"supports_lookup_by_request_key": False})
        who = tenant_with_key(ctx, "acme", 1000)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=1)
        ids = []
        for key, fault in (("made", "ambiguous=1"), ("lost", "reset=1")):  # the job made and its answer lost; none
            sim.set_faults(fault)
            ids.append(
                ctx.generations.create(who.tenant_id, key, {"prompt": key, "model": "sim-v1", "duration_s": 2}).task.id
            )
            drv.round()
        made, lost = ids
        drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"), max_rounds=5)
        (job,) = sim.truth()["jobs"]
        app, toasts = make_app(ctx)

        async def scenario(pilot: Pilot[Any]) -> None:
            await press(pilot, "4")
            screen = app.screen
            assert isinstance(screen, UnknownScreen)
            table = screen.query_one("#unknown", DataTable)
            assert list(rows(table)) == [str(made), str(lost)]  # oldest send first

            await press(pilot, "b")
            await type_text(pilot, job["id"])
            await press(pilot, "enter")
            modal = app.screen
            assert isinstance(modal, ConfirmModal) and job["id"] in str(modal.query_one("#confirm-lines").render())
            await type_text(pilot, "INC-30 found in console")
            await press(pilot, "enter")
            assert _status(ctx, made) != "SUBMIT_UNKNOWN"
            assert f"found: task {made} bound to job {job['id']}" in toasts.text()
            (audit,) = _audits(ctx, "tui reconcile bind")
            assert (audit.reason, audit.outcome, audit.affected_ids, audit.args["job_id"]) == (
                "INC-30 found in console",
                "ok",
                [str(made)],
                job["id"],
            )
            assert list(rows(table)) == [str(lost)]

            await press(pilot, "d")  # the send may still be in flight: refused, and says until when
            await type_text(pilot, "INC-31 not in console")
            await press(pilot, "enter")
            assert "may still be in flight" in toasts.text() and _status(ctx, lost) == "SUBMIT_UNKNOWN"
            ctx.clock.advance(ctx.sync.send_bound_s("sim") + ctx.settings.reconcile.visibility_lag_s)  # type: ignore[attr-defined]
            await press(pilot, "d")
            await type_text(pilot, "INC-31 not in console")
            await press(pilot, "enter")
            assert _status(ctx, lost) == "RETRY_WAIT"
            assert f"not_created: task {lost} new attempt scheduled" in toasts.text()
            (audit,) = [a for a in _audits(ctx, "tui reconcile not-created") if a.outcome == "ok"]
            assert audit.affected_ids == [str(lost)] and audit.args["not_created"] is True
            assert rows(table) == {}

        drive(app, scenario)
        with ctx.engine.connect() as conn:
            states = dict(
                conn.execute(
                    sa.select(task_attempts.c.task_id, task_attempts.c.submit_state).where(
                        task_attempts.c.task_id.in_(ids)
                    )
                ).all()
            )
        assert states[lost] == "FAILED_BEFORE_ACCEPT" and len(sim.truth()["jobs"]) == 1
        ctx.close()


def test_an_orphan_event_is_listed_and_replayed_with_a_reason(tmp_path: Path) -> None:
    with running_sim(seed=31, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim)
        # a job another deployment created on the same vendor account: nothing here owns it
        created = sim.http.request(
            "POST",
            "/v1/jobs",
            json={
                "prompt": "not ours",
                "model": "sim-v1",
                "duration_s": 2,
                "resolution": "720p",
                "aspect_ratio": "16:9",
            },
            headers={"Idempotency-Key": "other-deployment-1"},
        )
        assert created.status == 201, created.body
        job = created.json()["id"]
        body = json.dumps(dict(sim.state.get(job))).encode()
        assert (
            ctx.callbacks.receive("sim", sign_webhook([SECRET], f"msg-{job}", ctx.clock.now(), body), body).stored == 1
        )
        app, toasts = make_app(ctx)

        async def scenario(pilot: Pilot[Any]) -> None:
            assert rows(app.screen.query_one("#figures", DataTable))["orphans"][1] == "1"
            await press(pilot, "5")
            screen = app.screen
            assert isinstance(screen, ReplayScreen) and screen.kind == "dlq"
            assert rows(screen.query_one("#replay", DataTable)) == {}
            await press(pilot, "n")
            assert screen.kind == "orphans"
            (orphan,) = rows(screen.query_one("#replay", DataTable)).values()
            assert orphan[1:3] == ["sim", job]

            await press(pilot, "p")
            await type_text(pilot, "INC-7 foreign job")
            await press(pilot, "enter")
            assert "replay orphans" in toasts.text() and "still orphan=1" in toasts.text()
            (audit,) = _audits(ctx, "tui replay orphans")
            assert (audit.actor, audit.reason) == (OPERATOR, "INC-7 foreign job")
            # still unowned: it stays listed for a human (replaying again changes nothing)
            assert len(rows(screen.query_one("#replay", DataTable))) == 1

            await press(pilot, "n")
            assert screen.kind == "outbox" and rows(screen.query_one("#replay", DataTable)) == {}

        drive(app, scenario)
        ctx.close()


@pytest.mark.postgres
def test_a_lost_observation_is_listed_and_reduced_again_from_the_replay_screen(tmp_path: Path, pg_url: str) -> None:
    """Issue 14: what `aivedio replay observations` does, the TUI does on the chosen row: a stored `succeeded`
    whose message a flushed broker lost is listed under its own pile and, with a reason, moves its task on."""
    from aivedio_engine.providers.base import JobStatus
    from tests.flow.test_keep_moving import _lose_observed_messages, _rows, _store, _submitted

    with running_sim(seed=47, job_seconds=3000) as sim:
        ctx = _submitted(tmp_path, sim, pg_url, 2)
        lost, other = _rows(ctx, task_attempts)
        _store(ctx, lost, JobStatus.SUCCEEDED, "evt-lost")
        _store(ctx, other, JobStatus.RUNNING, "evt-other")
        assert _lose_observed_messages(ctx) == 2
        app, toasts = make_app(ctx)

        async def scenario(pilot: Pilot[Any]) -> None:
            await press(pilot, "5")
            screen = app.screen
            assert isinstance(screen, ReplayScreen)
            for _ in range(3):  # dlq → orphans → outbox → observations
                await press(pilot, "n")
            assert screen.kind == "observations"
            table = screen.query_one("#replay", DataTable)
            listed = rows(table)
            assert sorted((r[1], r[4]) for r in listed.values()) == sorted(
                [(str(lost.task_id), "succeeded"), (str(other.task_id), "running")]
            )
            chosen = next(k for k, r in listed.items() if r[1] == str(lost.task_id))
            table.move_cursor(row=table.get_row_index(chosen))
            await press(pilot, "p")  # the highlighted one only
            assert chosen in str(app.screen.query_one("#confirm-lines").render())
            await type_text(pilot, "INC-11 redis flushed")
            await press(pilot, "enter")
            assert "replay observations: rereduced (rereduced=1, failed=0)" in toasts.text()
            (audit,) = _audits(ctx, "tui replay observations")
            assert (audit.actor, audit.reason, audit.affected_ids) == (OPERATOR, "INC-11 redis flushed", [chosen])
            assert [r[1] for r in rows(table).values()] == [str(other.task_id)]  # the other one is still listed

        drive(app, scenario)
        assert {r.id: r.status for r in _rows(ctx, generation_tasks)} == {
            lost.task_id: "OUTPUT_FETCHING",
            other.task_id: "SUBMITTED",
        }
        ctx.close()
