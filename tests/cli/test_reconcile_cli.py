"""`aivedio reconcile` through the real root command, against PostgreSQL databases where real generations ended in
SUBMIT_UNKNOWN at the sim provider: the job was created and the answer lost (found), the connection dropped
before any job existed (not created, but only 60 s after the send), or the vendor cannot look jobs up (still
unknown, then parked). The CLI shares the engine clock with the test; the sim's config reaches it by a file."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_cli._mutate import write_plan
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts, credit_ledger, generation_tasks, task_attempts
from tests.support.app import tenant_with_key
from tests.support.cli import OPERATOR, Cli, audit_rows, status_of
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle, running_sim

pytestmark = pytest.mark.postgres
CANDIDATE_KEYS = {
    "task_id",
    "tenant_id",
    "attempt_id",
    "provider",
    "task_status",
    "sent_at",
    "lookup_count",
    "last_lookup_at",
    "next_action_at",
    "parked",
    "provider_can_look_up",
}
OUTCOME_KEYS = {
    "task_id",
    "attempt_id",
    "provider",
    "result",
    "action",
    "detail",
    "task_status",
    "provider_job_id",
    "next_action_at",
    "parked",
    "alerts",
    "provider_can_look_up",
}
SUMMARY_KEYS = {"found", "not_created", "still_unknown", "skipped", "error"}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def config_file(ctx: AppContext, path: Path) -> Path:
    """The test context's provider and reconcile settings as the TOML file an operator would have."""
    provider = ctx.settings.providers["sim"]
    values = provider.model_dump(mode="json")
    values["api_key"] = provider.api_key.get_secret_value()
    values["webhook_secrets"] = [s.get_secret_value() for s in provider.webhook_secrets]
    reconcile = ctx.settings.reconcile.model_dump(mode="json")
    lines = [
        'default_provider = "sim"',
        "",
        "[providers.sim]",
        *(f"{k} = {_toml(v)}" for k, v in values.items() if v is not None),  # TOML has no null: unset stays unset
        "",
        "[reconcile]",
        *(f"{k} = {_toml(v)}" for k, v in reconcile.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def unknown_world(
    tmp_path: Path, pg_url: str, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, n: int, **overrides: Any
) -> tuple[AppContext, Driver, list[Any], Cli]:
    """`n` real generations driven until every one is SUBMIT_UNKNOWN (before their first scheduled lookup)."""
    ctx = sim_context(tmp_path, sim, pg_url, **overrides)
    who = tenant_with_key(ctx, "acme", 1000)
    ids = [
        ctx.generations.create(
            who.tenant_id, f"k{i}", {"prompt": f"scene {i}", "model": "sim-v1", "duration_s": 2}
        ).task.id
        for i in range(n)
    ]
    drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True), step_s=1)
    drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"), max_rounds=5)
    return ctx, drv, ids, Cli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))


def by_task(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["task_id"]: t for t in doc["tasks"]}


def attempts_of(ctx: AppContext, task_id: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(task_attempts).where(task_attempts.c.task_id == task_id).order_by(task_attempts.c.attempt_no)
            )
        )


def test_found_binds_the_lost_job_after_a_preview_and_a_confirmation(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=41, faults="ambiguous=1", job_seconds=3) as sim:
        ctx, drv, ids, cli = unknown_world(tmp_path, pg_url, sim, monkeypatch, 3)
        names = {str(t) for t in ids}
        finds = sim.truth()["calls"].get("find", 0)

        refused = cli("reconcile", "--reason", "INC-9")  # no --yes and no terminal
        assert refused.exit_code == 4 and "--yes" in refused.stderr and str(ids[0]) in refused.stderr  # previewed
        assert "--reason" in cli.fails(2, "reconcile", "--yes")
        preview = cli.json("reconcile", "--dry-run")
        assert preview["schema"] == "aivedio.reconcile.v1" and preview["dry_run"] is True
        assert preview["count"] == 3 and set(by_task(preview)) == names
        assert all(set(t) == CANDIDATE_KEYS and t["task_status"] == "SUBMIT_UNKNOWN" for t in preview["tasks"])
        assert sim.truth()["calls"].get("find", 0) == finds  # neither the refusal nor the preview asked the vendor
        assert drv.all_in("SUBMIT_UNKNOWN")
        (dry,) = audit_rows(ctx, "reconcile")
        assert dry.dry_run and dry.outcome == "previewed" and set(dry.affected_ids) == names

        done = cli.json("reconcile", "--yes", "--reason", "INC-9 lost submit answers")
        assert done["dry_run"] is False and done["summary"] == {
            "found": 3,
            "not_created": 0,
            "still_unknown": 0,
            "skipped": 0,
            "error": 0,
        }
        assert set(done["summary"]) == SUMMARY_KEYS and all(set(t) == OUTCOME_KEYS for t in done["tasks"])
        truth = sim.truth()
        assert {t["provider_job_id"] for t in done["tasks"]} == {j["id"] for j in truth["jobs"]}
        assert {(t["result"], t["action"]) for t in done["tasks"]} == {("found", "bound_job")}
        for task_id in ids:
            (attempt,) = attempts_of(ctx, task_id)
            assert attempt.provider_job_id == by_task(done)[str(task_id)]["provider_job_id"]
            assert status_of(ctx, task_id) != "SUBMIT_UNKNOWN"
        audit = audit_rows(ctx, "reconcile")[-1]
        assert (audit.actor, audit.reason, audit.dry_run, audit.outcome) == (
            OPERATOR,
            "INC-9 lost submit answers",
            False,
            "ok",
        )
        assert set(audit.affected_ids) == names and audit.args["results"] == {"found": 3}

        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))  # the pipeline goes on from the bound jobs
        assert len(sim.truth()["jobs"]) == 3 and sim.truth()["duplicate_jobs"] == 0

        assert "no ambiguous submit" in cli.fails(4, "reconcile", "--task", str(ids[0]), "--yes", "--reason", "x")
        assert "not found" in cli.fails(5, "reconcile", "--task", str(uuid.uuid4()), "--yes", "--reason", "x")
        assert "not a task id" in cli.fails(2, "reconcile", "--task", "nope", "--dry-run")
        ctx.close()


def test_not_created_is_only_believed_after_the_send_bound_and_the_visibility_lag(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `reset` drops the connection before any job exists: client-side it looks exactly like `ambiguous`
    with running_sim(seed=42, faults="reset=1", job_seconds=3) as sim:
        ctx, drv, ids, cli = unknown_world(tmp_path, pg_url, sim, monkeypatch, 2)

        early = cli.json("reconcile", "--yes", "--reason", "INC-10")
        assert {(t["result"], t["action"], t["detail"]) for t in early["tasks"]} == {
            ("still_unknown", "next_lookup_scheduled", "not-found-yet")
        }
        assert all(t["next_action_at"] and t["task_status"] == "SUBMIT_UNKNOWN" for t in early["tasks"])
        assert drv.all_in("SUBMIT_UNKNOWN") and sim.truth()["jobs"] == []

        lag = ctx.settings.reconcile.visibility_lag_s
        ctx.clock.advance(lag + 1)  # type: ignore[attr-defined]
        # past the lag alone: a send refused only at its deadline could still be on its way
        inside = cli.json("reconcile", "--yes", "--reason", "INC-10")
        assert {(t["result"], t["task_status"]) for t in inside["tasks"]} == {("still_unknown", "SUBMIT_UNKNOWN")}
        ctx.clock.advance(ctx.sync.send_bound_s("sim"))  # type: ignore[attr-defined]
        late = cli.json("reconcile", "--yes", "--reason", "INC-10")
        assert {(t["result"], t["action"], t["task_status"]) for t in late["tasks"]} == {
            ("not_created", "new_attempt_scheduled", "RETRY_WAIT")
        }
        assert late["summary"]["not_created"] == 2

        sim.set_faults("")
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        for task_id in ids:
            first, second = attempts_of(ctx, task_id)
            assert first.submit_state == "FAILED_BEFORE_ACCEPT" and second.resubmitted_after_unknown
        assert len(sim.truth()["jobs"]) == 2  # one paid job per task
        ctx.close()


def test_without_lookup_it_stays_unknown_then_parks_with_an_alert(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=43, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx, drv, ids, cli = unknown_world(
            tmp_path, pg_url, sim, monkeypatch, 2, reconcile={"lookup_after_s": [10, 60], "park_after_s": 120}
        )

        waiting = cli.json("reconcile", "--yes", "--reason", "INC-11")
        assert {(t["result"], t["action"], t["parked"]) for t in waiting["tasks"]} == {
            ("still_unknown", "next_lookup_scheduled", False)
        }

        ctx.clock.advance(121)  # type: ignore[attr-defined]
        parked = cli.json("reconcile", "--yes", "--reason", "INC-11")
        assert {(t["result"], t["action"], t["parked"]) for t in parked["tasks"]} == {("still_unknown", "parked", True)}
        assert all(t["alerts"] == ["submit_unknown_parked"] for t in parked["tasks"])
        with ctx.engine.connect() as conn:
            reasons = (
                conn.execute(sa.select(generation_tasks.c.parked_reason).where(generation_tasks.c.id.in_(ids)))
                .scalars()
                .all()
            )
            raised = {
                r.subject_id for r in conn.execute(sa.select(alerts).where(alerts.c.rule == "submit_unknown_parked"))
            }
        assert all(reasons) and raised == {str(t) for t in ids}
        assert len(sim.truth()["jobs"]) == 2 and all(len(attempts_of(ctx, t)) == 1 for t in ids)  # no blind resubmit

        still = cli.json("reconcile", "--dry-run")  # parked tasks stay candidates: they wait for a human
        assert {t["task_id"]: t["parked"] for t in still["tasks"]} == {str(t): True for t in ids}
        shown = cli.json("tasks", "show", str(ids[0]))
        (alert,) = [i for i in shown["timeline"] if i["kind"] == "alert"]
        assert alert["rule"] == "submit_unknown_parked" and shown["task"]["parked_reason"]

        # the parked task's alert is the only sign it waits for a human: it may be acknowledged, not resolved
        alert_id = {a["subject_id"]: a["id"] for a in cli.json("alerts", "list")}[str(ids[0])]
        refused = cli.json("alerts", "resolve", alert_id, "--reason", "looks done", "--yes", code=4)
        assert refused["changed"] == [] and "still parked" in refused["refused"][0]["why"]
        assert cli.json("alerts", "ack", alert_id, "--reason", "INC-11", "--yes")["changed"] == [alert_id]
        assert cli.json("audit", "--check", "I2.2")["ok"] is True
        ctx.close()


def test_a_plan_applies_exactly_the_saved_set(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_sim(seed=44, faults="ambiguous=1", job_seconds=3) as sim:
        ctx, drv, (a, b), cli = unknown_world(tmp_path, pg_url, sim, monkeypatch, 2)
        plan = tmp_path / "plan.json"
        saved = cli.json("reconcile", "--plan-out", str(plan))
        assert saved["dry_run"] is True and saved["plan"] == str(plan) and set(by_task(saved)) == {str(a), str(b)}
        assert set(json.loads(plan.read_text())["ids"]) == {str(a), str(b)}

        c = ctx.generations.create(
            tenant_of(ctx, a), "late", {"prompt": "later", "model": "sim-v1", "duration_s": 2}
        ).task.id
        ctx.dispatcher.run_once()
        drv.pump.run()  # no sweep and no clock step: a and b keep waiting for their first lookup
        assert status_of(ctx, c) == "SUBMIT_UNKNOWN"
        assert len(cli.json("reconcile", "--dry-run")["tasks"]) == 3  # the filters would now match c too

        assert "--plan" in cli.fails(2, "reconcile", "--plan", str(plan), "--task", str(c), "--yes", "--reason", "x")
        refused = cli("reconcile", "--plan", str(plan), "--reason", "INC-12")
        assert refused.exit_code == 4 and drv.all_in("SUBMIT_UNKNOWN")

        applied = cli.json("reconcile", "--plan", str(plan), "--yes", "--reason", "INC-12")
        assert {t: o["result"] for t, o in by_task(applied).items()} == {str(a): "found", str(b): "found"}
        assert status_of(ctx, c) == "SUBMIT_UNKNOWN"
        assert set(audit_rows(ctx, "reconcile")[-1].affected_ids) == {str(a), str(b)}

        again = cli.json("reconcile", "--plan", str(plan), "--yes", "--reason", "INC-12")
        assert {t: o["result"] for t, o in by_task(again).items()} == {str(a): "skipped", str(b): "skipped"}

        doc = json.loads(plan.read_text())
        plan.write_text(json.dumps({**doc, "ids": [*doc["ids"], str(c)]}))  # edited by hand: digest mismatch
        assert "changed" in cli.fails(4, "reconcile", "--plan", str(plan), "--yes", "--reason", "x")
        other = tmp_path / "other.json"
        write_plan(other, "replay dlq", [str(c)], {})
        assert "replay dlq" in cli.fails(4, "reconcile", "--plan", str(other), "--yes", "--reason", "x")
        assert status_of(ctx, c) == "SUBMIT_UNKNOWN"
        ctx.close()


def tenant_of(ctx: AppContext, task_id: Any) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(
            sa.select(generation_tasks.c.tenant_id).where(generation_tasks.c.id == task_id)
        ).scalar_one()


# --- an operator's word on a parked submit: bind the job found in the vendor's console, or "never created" -------


def parked_world(
    tmp_path: Path, pg_url: str, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, n: int, **overrides: Any
) -> tuple[AppContext, Driver, list[Any], Cli]:
    """`n` generations at a sim that cannot look jobs up, driven (whole pipeline) until each one is parked."""
    ctx = sim_context(
        tmp_path,
        sim,
        pg_url,
        provider={"supports_lookup_by_request_key": False},
        reconcile={"lookup_after_s": [10, 60], "park_after_s": 150},
        **overrides,
    )
    who = tenant_with_key(ctx, "acme", 1000)
    ids = [
        ctx.generations.create(
            who.tenant_id, f"p{i}", {"prompt": f"scene {i}", "model": "sim-v1", "duration_s": 2}
        ).task.id
        for i in range(n)
    ]
    drv = Driver(ctx, sim, Pump(ctx), step_s=6)
    parked = sa.select(sa.func.count()).where(generation_tasks.c.parked_reason.is_not(None))
    drv.run_until(lambda: one(ctx, parked) == n, max_rounds=60)
    assert drv.all_in("SUBMIT_UNKNOWN")
    return ctx, drv, ids, Cli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))


def one(ctx: AppContext, stmt: Any) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(stmt).scalar_one()


def ledger_of(ctx: AppContext, task_id: Any) -> list[tuple[str, Decimal]]:
    with ctx.engine.connect() as conn:
        return [
            (r.entry_type, r.amount)
            for r in conn.execute(
                sa.select(credit_ledger)
                .where(credit_ledger.c.task_id == task_id)
                .order_by(credit_ledger.c.created_at, credit_ledger.c.id)
            )
        ]


def snapshot(ctx: AppContext, task_ids: list[Any]) -> Any:
    """Everything a settlement could change about these tasks (the audit log aside)."""
    with ctx.engine.connect() as conn:
        tasks_now = conn.execute(
            sa.select(generation_tasks).where(generation_tasks.c.id.in_(task_ids)).order_by(generation_tasks.c.id)
        ).all()
    return tasks_now, [attempts_of(ctx, t) for t in task_ids], [ledger_of(ctx, t) for t in task_ids]


def test_bind_a_parked_submit_to_the_job_found_in_the_vendor_console(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=45, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx, drv, (task,), cli = parked_world(tmp_path, pg_url, sim, monkeypatch, 1)
        (attempt,) = attempts_of(ctx, task)
        (job,) = sim.truth()["jobs"]  # what the operator finds in the console by the request key
        assert job["request_key"] == attempt.provider_request_key
        before = snapshot(ctx, [task])
        assert before[2] == [[("RESERVE", Decimal("-2"))]]

        preview = cli.json("reconcile", "--task", str(task), "--job-id", job["id"], "--dry-run")
        assert preview["dry_run"] is True and preview["count"] == 1
        (plan,) = preview["tasks"]
        assert (plan["settle"], plan["provider_job_id"], plan["attempt_id"]) == ("bind_job", job["id"], str(attempt.id))
        assert plan["job_status"] in ("running", "succeeded") and plan["parked"] is True
        assert snapshot(ctx, [task]) == before  # a preview changes nothing
        assert audit_rows(ctx, "reconcile")[-1].dry_run

        assert "--reason" in cli.fails(2, "reconcile", "--task", str(task), "--job-id", job["id"], "--yes")
        done = cli.json(
            "reconcile", "--task", str(task), "--job-id", job["id"], "--reason", "INC-20 found in console", "--yes"
        )
        (bound,) = done["tasks"]
        assert (bound["result"], bound["action"], bound["provider_job_id"]) == ("found", "bound_job", job["id"])
        assert bound["parked"] is False and bound["task_status"] != "SUBMIT_UNKNOWN"
        (attempt,) = attempts_of(ctx, task)
        assert attempt.provider_job_id == job["id"] and attempt.submit_state != "UNKNOWN"
        audit = audit_rows(ctx, "reconcile")[-1]
        assert (audit.reason, audit.dry_run, audit.outcome, audit.affected_ids) == (
            "INC-20 found in console",
            False,
            "ok",
            [str(task)],
        )
        assert audit.args["job_id"] == job["id"]

        drv.run_until(lambda: drv.all_in("SUCCEEDED"))  # the task goes on from the job's state
        assert ledger_of(ctx, task) == [("RESERVE", Decimal("-2")), ("SETTLE", Decimal("0"))]  # the bill, once
        assert len(sim.truth()["jobs"]) == 1
        assert "no ambiguous submit" in cli.fails(
            4, "reconcile", "--task", str(task), "--job-id", job["id"], "--reason", "again", "--yes"
        )
        ctx.close()


def test_a_job_another_attempt_holds_or_another_request_made_is_refused(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=46, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx, drv, (a, b), cli = parked_world(tmp_path, pg_url, sim, monkeypatch, 2)
        job_of = {j["request_key"]: j["id"] for j in sim.truth()["jobs"]}
        job_a, job_b = (job_of[attempts_of(ctx, t)[0].provider_request_key] for t in (a, b))
        before = snapshot(ctx, [a, b])

        # the vendor says b's job was made for b's request: never a's, even while nobody holds it
        refused = cli.fails(4, "reconcile", "--task", str(a), "--job-id", job_b, "--reason", "INC-21", "--yes")
        assert job_b in refused and "request" in refused
        assert "no job" in cli.fails(5, "reconcile", "--task", str(a), "--job-id", "job_nope", "--reason", "x", "--yes")
        assert snapshot(ctx, [a, b]) == before

        cli.json("reconcile", "--task", str(b), "--job-id", job_b, "--reason", "INC-21", "--yes")
        before = snapshot(ctx, [a, b])
        held = cli.fails(4, "reconcile", "--task", str(a), "--job-id", job_b, "--reason", "INC-21", "--yes")
        assert job_b in held and str(b) in held and "already" in held
        assert "already" in cli.fails(4, "reconcile", "--task", str(a), "--job-id", job_b, "--dry-run")
        assert snapshot(ctx, [a, b]) == before  # nothing changed
        assert status_of(ctx, a) == "SUBMIT_UNKNOWN" and attempts_of(ctx, a)[0].provider_job_id is None
        assert job_a != job_b
        ctx.close()


def test_not_created_is_refused_while_the_send_may_be_in_flight_then_resubmits(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `reset` drops the connection before any job exists; the vendor cannot look jobs up, so only a person can
    # say it never created one
    with running_sim(seed=47, faults="reset=1", job_seconds=3, lookup=False) as sim:
        ctx, drv, ids, cli = unknown_world(
            tmp_path,
            pg_url,
            sim,
            monkeypatch,
            1,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60], "park_after_s": 900},
        )
        (task,) = ids
        (attempt,) = attempts_of(ctx, task)
        before = snapshot(ctx, [task])
        window = ctx.sync.send_bound_s("sim") + ctx.settings.reconcile.visibility_lag_s
        allowed = (attempt.submitted_at + timedelta(seconds=window)).astimezone(UTC)

        early = cli.fails(4, "reconcile", "--task", str(task), "--not-created", "--reason", "INC-22", "--yes")
        assert "in flight" in early and f"{allowed:%Y-%m-%d %H:%M:%S}" in early
        assert "in flight" in cli.fails(4, "reconcile", "--task", str(task), "--not-created", "--dry-run")
        assert snapshot(ctx, [task]) == before

        ctx.clock.advance((allowed - ctx.clock.now()).total_seconds() + 1)  # type: ignore[attr-defined]
        preview = cli.json("reconcile", "--task", str(task), "--not-created", "--dry-run")
        assert [(t["settle"], t["attempt_id"]) for t in preview["tasks"]] == [("not_created", str(attempt.id))]
        assert snapshot(ctx, [task]) == before
        done = cli.json("reconcile", "--task", str(task), "--not-created", "--reason", "INC-22 not in console", "--yes")
        assert [(t["result"], t["action"], t["task_status"]) for t in done["tasks"]] == [
            ("not_created", "new_attempt_scheduled", "RETRY_WAIT")
        ]
        audit = audit_rows(ctx, "reconcile")[-1]
        assert (audit.reason, audit.outcome, audit.args["not_created"]) == ("INC-22 not in console", "ok", True)

        sim.set_faults("")
        drv.pump = Pump(ctx)
        drv.run_until(lambda: drv.all_in("SUCCEEDED"))
        first, second = attempts_of(ctx, task)
        assert first.submit_state == "FAILED_BEFORE_ACCEPT" and second.resubmitted_after_unknown
        assert ledger_of(ctx, task) == [("RESERVE", Decimal("-2")), ("SETTLE", Decimal("0"))]
        assert len(sim.truth()["jobs"]) == 1  # one paid job
        ctx.close()


def test_not_created_of_a_task_being_canceled_releases_the_credits(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=48, faults="reset=1", job_seconds=3, lookup=False) as sim:
        ctx, drv, (task,), cli = parked_world(tmp_path, pg_url, sim, monkeypatch, 1)
        cli.json("tasks", "cancel", str(task), "--reason", "tenant gave up", "--yes")
        assert status_of(ctx, task) == "CANCEL_REQUESTED"
        done = cli.json("reconcile", "--task", str(task), "--not-created", "--reason", "INC-23", "--yes")
        assert [(t["result"], t["action"], t["task_status"]) for t in done["tasks"]] == [
            ("not_created", "canceled", "CANCELED")
        ]
        (attempt,) = attempts_of(ctx, task)
        assert attempt.submit_state == "FAILED_BEFORE_ACCEPT"
        assert ledger_of(ctx, task) == [("RESERVE", Decimal("-2")), ("RELEASE", Decimal("2"))]
        assert sim.truth()["jobs"] == []
        ctx.close()


def test_settling_by_hand_is_for_one_named_task(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_sim(seed=49, faults="ambiguous=1", job_seconds=3) as sim:
        ctx, drv, (task,), cli = unknown_world(tmp_path, pg_url, sim, monkeypatch, 1)
        before = snapshot(ctx, [task])
        t = str(task)
        for settle in (["--job-id", "job_1"], ["--not-created"]):
            assert "--task" in cli.fails(2, "reconcile", *settle, "--reason", "x", "--yes")
            for extra in (
                ["--plan", str(tmp_path / "p.json")],
                ["--plan-out", str(tmp_path / "p.json")],
                ["--provider", "sim"],
                ["--older-than", "1m"],
            ):
                message = cli.fails(2, "reconcile", "--task", t, *settle, *extra, "--reason", "x", "--yes")
                assert extra[0] in message
            assert "--reason" in cli.fails(2, "reconcile", "--task", t, *settle, "--yes")
        both = cli.fails(2, "reconcile", "--task", t, "--job-id", "j", "--not-created", "--reason", "x", "--yes")
        assert "--not-created" in both and "--job-id" in both
        assert snapshot(ctx, [task]) == before and not (tmp_path / "p.json").exists()
        assert audit_rows(ctx, "reconcile") == []

        # past the window, but this vendor looks jobs up and has one for the request: bind it, never pay twice
        ctx.clock.advance(ctx.sync.send_bound_s("sim") + ctx.settings.reconcile.visibility_lag_s)  # type: ignore[attr-defined]
        (job,) = sim.truth()["jobs"]
        found = cli.fails(4, "reconcile", "--task", t, "--not-created", "--reason", "x", "--yes")
        assert f"--job-id {job['id']}" in found
        assert snapshot(ctx, [task]) == before
        ctx.close()
