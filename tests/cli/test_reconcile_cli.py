"""`aivedio reconcile` through the real root command, against PostgreSQL databases where real generations ended in
SUBMIT_UNKNOWN at the sim provider: the job was created and the answer lost (found), the connection dropped
before any job existed (not created, but only 60 s after the send), or the vendor cannot look jobs up (still
unknown, then parked). The CLI shares the engine clock with the test; the sim's config reaches it by a file."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_cli._mutate import write_plan
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import alerts, generation_tasks, task_attempts
from tests.cli.test_tasks_cli import OPERATOR, Cli, audit_rows, status_of
from tests.support.app import tenant_with_key
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


def test_not_created_is_only_believed_60_s_after_the_send(
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

        ctx.clock.advance(61)  # type: ignore[attr-defined]
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
