"""`aivedio tasks list|show|tail|cancel` through the real root command, against PostgreSQL databases seeded by
running real generations: the sim provider, the in-process pump, and both clocks under the test's control."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import Result

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db import tasks as task_rows
from aivedio_engine.db.tables import credit_ledger, task_state_events
from aivedio_engine.domain.status import EventSource, StateEventOutcome
from aivedio_engine.services.liveness import NO_ENGINE
from aivedio_engine.services.task_ops import TaskOps
from tests.support.app import tenant_with_key
from tests.support.cli import OPERATOR, Cli, audit_rows, status_of
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

pytestmark = pytest.mark.postgres
TASK_KEYS = {
    "task_id",
    "tenant_id",
    "tenant",
    "status",
    "version",
    "model",
    "provider",
    "attempts",
    "progress",
    "parked_reason",
    "last_error_class",
    "created_at",
    "updated_at",
}
EVENT_KEYS = {
    "cursor",
    "at",
    "task_id",
    "attempt_id",
    "source",
    "event_type",
    "from_status",
    "to_status",
    "task_version",
    "outcome",
}


def create(ctx: AppContext, tenant_id: Any, key: str, prompt: str = "a paper boat") -> Any:
    return ctx.generations.create(tenant_id, key, {"prompt": prompt, "model": "sim-v1", "duration_s": 2}).task.id


# --- list ----------------------------------------------------------------------------------------------------


def test_list_filters_by_status_tenant_provider_age_and_limit(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=31, job_seconds=600) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        acme, globex = tenant_with_key(ctx, "acme", 1000), tenant_with_key(ctx, "globex", 1000)
        mine = [create(ctx, acme.tenant_id, f"a{i}") for i in range(3)]
        theirs = create(ctx, globex.tenant_id, "g0")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("RUNNING"))
        ctx.clock.advance(2 * 3600)  # type: ignore[attr-defined]
        ctx.generations.cancel(acme.tenant_id, mine[0])  # the only task touched in the last two hours
        cli = Cli(ctx, monkeypatch)

        every = cli.json("tasks", "list")
        assert every["schema"] == "aivedio.tasks.v1" and every["count"] == 4
        assert all(set(t) == TASK_KEYS for t in every["tasks"])
        assert every["tasks"][0]["task_id"] == str(mine[0])  # most recently updated first
        assert {t["task_id"]: t["status"] for t in every["tasks"]} == {
            str(mine[0]): "CANCEL_REQUESTED",
            str(mine[1]): "RUNNING",
            str(mine[2]): "RUNNING",
            str(theirs): "RUNNING",
        }

        def ids(*args: str) -> set[str]:
            return {t["task_id"] for t in cli.json("tasks", "list", *args)["tasks"]}

        assert ids("--status", "running") == {str(mine[1]), str(mine[2]), str(theirs)}
        assert ids("--tenant", "globex") == {str(theirs)}
        assert ids("--tenant", str(acme.tenant_id)) == {str(t) for t in mine}
        assert ids("--provider", "sim") == {str(t) for t in [*mine, theirs]} and ids("--provider", "other") == set()
        assert ids("--older-than", "1h") == {str(mine[1]), str(mine[2]), str(theirs)}
        assert ids("--older-than", "3h") == set()
        assert len(ids("--limit", "2")) == 2
        cut = cli.json("tasks", "list", "--status", "running", "--limit", "2")
        assert (cut["count"], cut["total"]) == (2, 3)  # the filter's whole count, beside the rows shown
        cut_table = cli("tasks", "list", "--status", "running", "--limit", "2")
        assert cut_table.stderr.strip() == "2 of 3 task(s) shown; --limit shows more"

        table = cli("tasks", "list", "--status", "CANCEL_REQUESTED")
        assert table.exit_code == 0 and str(mine[0]) in table.stdout and str(mine[1]) not in table.stdout
        assert "1 task(s)" in table.stderr

        assert "NOPE" in cli.fails(2, "tasks", "list", "--status", "NOPE")
        assert "--older-than" in cli.fails(2, "tasks", "list", "--older-than", "soon")
        assert "nobody" in cli.fails(5, "tasks", "list", "--tenant", "nobody")
        ctx.close()


# --- show ----------------------------------------------------------------------------------------------------


def test_show_merges_the_whole_story_of_a_task_into_one_timeline(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=32, job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim, pg_url, media={"review_prompt_terms": ["lighthouse"]})
        who = tenant_with_key(ctx, "acme", 1000)
        done = create(ctx, who.tenant_id, "k1", "a quiet harbour")
        held = create(ctx, who.tenant_id, "k2", "a lighthouse at dusk")
        drv = Driver(ctx, sim, Pump(ctx))
        drv.run_until(lambda: drv.all_in("SUCCEEDED", "MANUAL_REVIEW"), max_rounds=60)
        cli = Cli(ctx, monkeypatch)

        shown = cli("tasks", "show", str(done), "--json")
        assert shown.exit_code == 0, shown.output
        assert sim.base_url not in shown.stdout  # no provider URL (signed output links) is ever printed
        doc = json.loads(shown.stdout)
        assert doc["schema"] == "aivedio.task.v1"
        assert doc["task"]["task_id"] == str(done) and doc["task"]["status"] == "SUCCEEDED"
        items = doc["timeline"]
        assert [i["at"] for i in items] == sorted(i["at"] for i in items)
        assert {"state_event", "attempt", "provider_event", "ledger", "asset", "outbox"} <= {i["kind"] for i in items}
        assert all({"at", "kind", "id"} <= set(i) for i in items)

        with ctx.engine.connect() as conn:
            history = [
                (r.from_status, r.to_status, r.outcome, r.source)
                for r in conn.execute(
                    sa.select(task_state_events)
                    .where(task_state_events.c.task_id == done)
                    .order_by(task_state_events.c.task_version, task_state_events.c.id)
                )
            ]
        events = [
            (i["from_status"], i["to_status"], i["outcome"], i["source"]) for i in items if i["kind"] == "state_event"
        ]
        assert sorted(events, key=str) == sorted(history, key=str) and events[-1][1] == "SUCCEEDED"
        assert [e[1] for e in events if e[2] == "applied"][:2] == ["CREATED", "VALIDATING"]

        (attempt,) = [i for i in items if i["kind"] == "attempt"]
        job_id = attempt["provider_job_id"]
        assert attempt["submit_state"] == "SUCCEEDED" and attempt["submitted_at"]
        assert job_id in {j["id"] for j in sim.truth()["jobs"]}
        provider_events = [i for i in items if i["kind"] == "provider_event"]
        assert provider_events and all(
            p["provider_job_id"] == job_id and p["matched"] and not p["orphan"] for p in provider_events
        )
        assert "succeeded" in {str(p["status"]).lower() for p in provider_events}
        assert [i["entry_type"] for i in items if i["kind"] == "ledger"] == ["RESERVE", "SETTLE"]
        assets = [i for i in items if i["kind"] == "asset"]
        raw = [a for a in assets if a["asset_kind"] == "RAW_OUTPUT"]
        assert len(raw) == 1 and raw[0]["status"] == "READY" and raw[0]["size_bytes"] > 0
        assert {a["profile"] for a in assets if a["parent_asset_id"] == raw[0]["id"]} >= {
            "proxy_mp4",
            "hls",
            "thumbnail",
        }
        # creation writes no generation.queued row any more (the dispatcher scans QUEUED tasks itself)
        assert {"fetch.requested", "task.status.changed"} <= {i["event_type"] for i in items if i["kind"] == "outbox"}

        review = cli.json("tasks", "show", str(held))
        assert review["task"]["status"] == "MANUAL_REVIEW"
        (item,) = [i for i in review["timeline"] if i["kind"] == "review"]
        assert item["state"] == "PENDING" and "lighthouse" in item["reason"]

        text = cli("tasks", "show", str(done))
        assert text.exit_code == 0 and "SUCCEEDED" in text.stdout and "SETTLE" in text.stdout
        assert "not found" in cli.fails(5, "tasks", "show", str(uuid.uuid4()))
        assert "not a task id" in cli.fails(2, "tasks", "show", "nope")
        ctx.close()


# --- tail ----------------------------------------------------------------------------------------------------


def _lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_tail_once_prints_what_is_new_and_resumes_after_a_cursor(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=33, job_seconds=600) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", 1000)
        ids = {str(create(ctx, who.tenant_id, f"k{i}")) for i in range(2)}
        cli = Cli(ctx, monkeypatch)

        first = _lines(cli("tasks", "tail", "--once", "--json", "--last", "3"))
        assert len(first) == 3 and all(set(e) == EVENT_KEYS for e in first)
        assert [e["cursor"] for e in first] == sorted(e["cursor"] for e in first)
        assert first[-1]["to_status"] == "QUEUED"
        cursor = first[-1]["cursor"]
        assert _lines(cli("tasks", "tail", "--once", "--json", "--after", cursor)) == []

        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("RUNNING"))
        new = _lines(cli("tasks", "tail", "--once", "--json", "--after", cursor))
        assert new and all(uuid.UUID(e["cursor"]) > uuid.UUID(cursor) for e in new)
        assert len({e["cursor"] for e in new}) == len(new)
        assert {e["task_id"] for e in new if e["to_status"] == "RUNNING"} == ids
        running = _lines(cli("tasks", "tail", "--once", "--json", "--after", cursor, "--status", "RUNNING"))
        assert {e["task_id"] for e in running} == ids and {e["to_status"] for e in running} == {"RUNNING"}

        text = cli("tasks", "tail", "--once", "--after", cursor)
        assert text.exit_code == 0 and "→ RUNNING" in text.stdout and f"cursor: {new[-1]['cursor']}" in text.stderr
        assert "not a cursor" in cli.fails(2, "tasks", "tail", "--once", "--after", "yesterday")
        ctx.close()


def test_a_live_tail_shows_an_event_whose_transaction_committed_late(tmp_path: Path, pg_url: str) -> None:
    """Ids are taken before commit: an event with an earlier id may become visible after a later one."""
    with running_sim(seed=34, job_seconds=600) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        who = tenant_with_key(ctx, "acme", 1000)
        follower = TaskOps(ctx.engine, ctx.clock).tail(last=0)
        assert follower.poll() == []
        early_id = new_id()  # this transaction took its id first ...
        task_id = create(ctx, who.tenant_id, "k1")  # ... and this one committed first
        shown = follower.poll()
        assert [e["to_status"] for e in shown] == ["CREATED", "VALIDATING", "QUOTA_RESERVED", "QUEUED"]
        with ctx.engine.begin() as conn:
            conn.execute(
                task_state_events.insert().values(
                    **{
                        **task_rows.event_row(
                            task_id=task_id,
                            source=EventSource.ADMIN,
                            source_event_id="late-commit",
                            event_type="late",
                            from_status=None,
                            to_status=None,
                            task_version=3,
                            outcome=StateEventOutcome.DUPLICATE,
                            now=ctx.clock.now(),
                        ),
                        "id": early_id,
                    }
                )
            )
        assert [e["event_type"] for e in follower.poll()] == ["late"]
        assert follower.poll() == []  # once only
        ctx.close()


# --- cancel --------------------------------------------------------------------------------------------------


def test_cancel_as_an_operator_is_confirmed_audited_and_follows_the_cancel_rules(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_sim(seed=35, job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        acme, globex = tenant_with_key(ctx, "acme", 1000), tenant_with_key(ctx, "globex", 1000)
        fetching = create(ctx, acme.tenant_id, "f")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING"))
        sim.configure(job_seconds=600)
        running = create(ctx, acme.tenant_id, "r")
        drv.run_until(lambda: status_of(ctx, running) == "RUNNING")
        cli = Cli(ctx, monkeypatch)

        refused = cli("tasks", "cancel", str(running), "--reason", "stuck")  # no --yes and no terminal
        assert refused.exit_code == 4 and "--yes" in refused.stderr
        assert status_of(ctx, running) == "RUNNING" and audit_rows(ctx, "tasks cancel") == []
        assert "--reason" in cli.fails(2, "tasks", "cancel", str(running), "--yes")

        preview = cli.json("tasks", "cancel", str(running), "--dry-run")
        assert preview == {
            "task_id": str(running),
            "tenant_id": str(acme.tenant_id),
            "from_status": "RUNNING",
            "to_status": "CANCEL_REQUESTED",
            "outcome": "would_request_cancel",
            "dry_run": True,
            "released": None,
        }
        assert status_of(ctx, running) == "RUNNING"
        (dry,) = audit_rows(ctx, "tasks cancel")
        assert dry.dry_run and dry.actor == OPERATOR and dry.affected_ids == [str(running)] and dry.reason is None

        run = cli("tasks", "cancel", str(running), "--yes", "--reason", "INC-7 stuck render", "--json")
        assert run.exit_code == 0, run.output
        done = json.loads(run.stdout)
        # only requested: no engine process runs (the driver below plays the roles by hand), and the command says so
        assert run.stderr.splitlines() == [NO_ENGINE]
        assert done["outcome"] == "cancel_requested" and done["to_status"] == "CANCEL_REQUESTED"
        assert status_of(ctx, running) == "CANCEL_REQUESTED"
        audit = audit_rows(ctx, "tasks cancel")[-1]
        assert (audit.actor, audit.reason, audit.affected_ids, audit.dry_run, audit.outcome) == (
            OPERATOR,
            "INC-7 stuck render",
            [str(running)],
            False,
            "cancel_requested",
        )
        with ctx.engine.connect() as conn:
            event = conn.execute(
                sa.select(task_state_events).where(
                    task_state_events.c.task_id == running, task_state_events.c.to_status == "CANCEL_REQUESTED"
                )
            ).one()
        assert event.source == "admin" and event.payload == {"requested_by": OPERATOR, "reason": "INC-7 stuck render"}
        drv.run_until(lambda: status_of(ctx, running) == "CANCELED")
        assert [j["canceled"] for j in sim.truth()["jobs"] if j["status"] == "canceled"] == [True]

        again = cli.json("tasks", "cancel", str(running), "--yes", "--reason", "again")
        assert again["outcome"] == "already" and again["to_status"] == "CANCELED"

        queued = create(ctx, globex.tenant_id, "q")  # another tenant: operators are not tenant-scoped
        released = cli.json("tasks", "cancel", str(queued), "--yes", "--reason", "tenant asked")
        assert released["outcome"] == "canceled" and status_of(ctx, queued) == "CANCELED"
        with ctx.engine.connect() as conn:
            (release,) = conn.execute(
                sa.select(credit_ledger).where(
                    credit_ledger.c.task_id == queued, credit_ledger.c.entry_type == "RELEASE"
                )
            ).all()
        assert Decimal(released["released"]) == release.amount > 0 and release.created_by == f"operator:{OPERATOR}"

        assert "OUTPUT_FETCHING" in cli.fails(4, "tasks", "cancel", str(fetching), "--yes", "--reason", "late")
        assert status_of(ctx, fetching) == "OUTPUT_FETCHING"
        assert "not found" in cli.fails(5, "tasks", "cancel", str(uuid.uuid4()), "--yes", "--reason", "x")
        ctx.close()
