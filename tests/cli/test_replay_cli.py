"""`aivedio replay dlq|orphans|outbox` through the real root command, against databases seeded by real work.

Dead letters come from the Dramatiq path (relay → StubBroker → worker → actor) with a failpoint making the
consumer fail until its retries are exhausted; DEAD outbox rows from a relay whose broker refuses every enqueue
10 times; orphan provider events from signed sim callbacks through the callback service — one for a job another
deployment created, one that loses the race with the submit response recording its job id.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import (
    audit_log,
    dead_letters,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    provider_events,
    task_attempts,
    task_state_events,
)
from aivedio_engine.providers.webhooks import sign_webhook
from aivedio_engine.services import intake
from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointError
from aivedio_engine.worker.actors import declare_actors
from aivedio_engine.worker.broker import setup_broker
from aivedio_engine.worker.relay import Relay
from tests.chaos.support import insert_queued_events
from tests.support.app import make_context, tenant_with_key
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import SECRET, running_sim

pytestmark = pytest.mark.postgres
runner = CliRunner()


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


def cli(url: str, data_dir: Path, *args: str) -> Any:
    # a wide "terminal", so human tables show whole ids
    return runner.invoke(
        app, ["--set", f"database.url={url}", "--set", f"data_dir={data_dir}", *args], env={"COLUMNS": "250"}
    )


def ok_json(result: Any, code: int = 0) -> dict[str, Any]:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def rows(ctx: AppContext, table: sa.Table, *where: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(table).where(*where)).all())


def audits(ctx: AppContext, command: str) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(audit_log)
                .where(audit_log.c.command == command)
                .order_by(audit_log.c.created_at, audit_log.c.id)
            ).all()
        )


class Dramatiq:
    """The real delivery path: relay → StubBroker → worker threads → the declared actors."""

    def __init__(self, ctx: AppContext) -> None:
        self.broker = setup_broker(ctx.settings, ctx)
        self.actors = declare_actors(self.broker, ctx)
        # the consumer keeps its own retry count (5); only its backoff is shortened, so exhausting the retries
        # takes milliseconds instead of ~15 s of real time
        self.actors["on_generation_queued"].options.update(min_backoff=1, max_backoff=5)
        self.worker = dramatiq.Worker(self.broker, worker_threads=1, worker_timeout=20)
        self.relay = Relay(ctx.engine, self.broker, ctx.clock)

    def __enter__(self) -> Dramatiq:
        self.worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop(timeout=10_000)
        self.broker.close()

    def drain(self) -> None:
        self.broker.join("dispatch", timeout=30_000)
        self.worker.join()


def queue_tasks(ctx: AppContext, tenant: str, n: int) -> list[uuid.UUID]:
    """QUEUED tasks whose only outbox row is a legacy `generation.queued` (creation writes none any more; the
    intake consumer still drains such rows): one inbox-deduplicated message per task to kill and replay."""
    who = tenant_with_key(ctx, tenant, credits=1000)
    task_ids = [
        ctx.generations.create(
            who.tenant_id, f"{tenant}-{i}", {"prompt": f"shot {i}", "model": "local-v1", "duration_s": 2}
        ).task.id
        for i in range(n)
    ]
    with ctx.engine.begin() as conn:
        conn.execute(outbox_events.delete().where(outbox_events.c.aggregate_id.in_(task_ids)))
        insert_queued_events(conn, who.tenant_id, task_ids, now=ctx.clock.now())
    return task_ids


def poison(failure: dict[str, Callable[[], BaseException] | None]) -> None:
    """Make every intake transaction fail just before its commit while `failure["make"]` is set."""

    def fire() -> None:
        make = failure["make"]
        if make is not None:
            raise make()

    failpoints.enable("consume.before_commit", fire)


def test_dlq_preview_plan_apply_and_repeat(tmp_path: Path, pg_url: str) -> None:
    ctx = make_context(tmp_path / "data", pg_url)
    data = tmp_path / "data"
    failure: dict[str, Callable[[], BaseException] | None] = {"make": None}
    poison(failure)
    with Dramatiq(ctx) as d:
        failure["make"] = lambda: ConnectionResetError("server closed the connection unexpectedly")
        reset_tasks = queue_tasks(ctx, "acme", 2)
        assert d.relay.run_once() == 2
        d.drain()
        failure["make"] = lambda: TimeoutError("canceling statement due to statement timeout")
        (slow_task,) = queue_tasks(ctx, "globex", 1)
        assert d.relay.run_once() == 1
        d.drain()
        failure["make"] = None

        letters = {r.message["args"][0]["aggregate_id"]: r for r in rows(ctx, dead_letters)}
        assert set(letters) == {str(t) for t in (*reset_tasks, slow_task)}
        assert all(r.seen_count == 1 and r.message["options"]["retries"] == 6 for r in letters.values())
        assert letters[str(slow_task)].error == "TimeoutError: canceling statement due to statement timeout"
        assert rows(ctx, inbox_dedup) == []

        # preview: an exact count and every selected row; a dry run changes nothing but is audited
        preview = ok_json(cli(pg_url, data, "replay", "dlq", "--dry-run", "--json"))
        assert preview["schema"] == "aivedio.replay.v1" and preview["kind"] == "dlq"
        assert (preview["total"], preview["selected"]) == (3, 3)
        assert set(preview["items"][0]) == {
            "id",
            "task_id",
            "message_id",
            "actor",
            "queue",
            "error",
            "seen_count",
            "first_seen_at",
            "last_seen_at",
            "replayed_at",
        }
        assert preview["result"]["outcome"] == "dry_run" and len(preview["result"]["replayed"]) == 3
        assert {r.status for r in rows(ctx, outbox_events)} == {"PUBLISHED"}
        assert all(r.replayed_at is None for r in rows(ctx, dead_letters))

        human = cli(pg_url, data, "replay", "dlq", "--dry-run")
        assert human.exit_code == 0 and "3 dead letter(s) match" in human.stdout
        assert "on_generation_queued" in human.stdout and "dry run: would replay 3" in human.stdout

        limited = ok_json(cli(pg_url, data, "replay", "dlq", "--limit", "1", "--dry-run", "--json"))
        assert (limited["total"], limited["selected"]) == (3, 1)

        # --error-class matches the class (or any part of the text), case-insensitively; save that set
        plan = tmp_path / "plan.json"
        saved = ok_json(
            cli(pg_url, data, "replay", "dlq", "--error-class", "connectionreset", "--plan-out", str(plan), "--json")
        )
        planned = {letters[str(t)].id.hex for t in reset_tasks}
        assert saved["total"] == 2 and {uuid.UUID(i).hex for i in json.loads(plan.read_text())["ids"]} == planned

        # guard rails: no reason, no terminal, filters beside a plan, an edited plan, another command's plan
        assert cli(pg_url, data, "replay", "dlq", "--plan", str(plan), "--yes").exit_code == 2
        refused = cli(pg_url, data, "replay", "dlq", "--plan", str(plan), "--reason", "db failover")
        assert refused.exit_code == 4 and "--yes" in refused.stderr
        assert (
            cli(pg_url, data, "replay", "dlq", "--plan", str(plan), "--actor", "x", "--reason", "r", "--yes").exit_code
            == 2
        )
        doc = json.loads(plan.read_text())
        tampered = tmp_path / "tampered.json"
        tampered.write_text(json.dumps({**doc, "ids": doc["ids"] + [str(letters[str(slow_task)].id)]}))
        assert cli(pg_url, data, "replay", "dlq", "--plan", str(tampered), "--reason", "r", "--yes").exit_code == 4
        assert cli(pg_url, data, "replay", "outbox", "--plan", str(plan), "--reason", "r", "--yes").exit_code == 4
        assert all(r.replayed_at is None for r in rows(ctx, dead_letters))

        # apply: exactly the planned letters, through the outbox, under their original event ids
        applied = ok_json(
            cli(pg_url, data, "replay", "dlq", "--plan", str(plan), "--reason", "db failover", "--yes", "--json")
        )
        replayed = applied["result"]["replayed"]
        assert {uuid.UUID(r["id"]).hex for r in replayed} == planned and applied["result"]["outcome"] == "replayed"
        events = {uuid.UUID(r["event_id"]) for r in replayed}
        assert events == {uuid.UUID(letters[str(t)].message_id) for t in reset_tasks}
        outbox = {r.id: r for r in rows(ctx, outbox_events)}
        assert {i for i, r in outbox.items() if r.status == "PENDING"} == events
        assert all(outbox[e].publish_attempts == 0 for e in events)
        pending = rows(ctx, dead_letters, dead_letters.c.replayed_at.is_(None))
        assert letters[str(slow_task)].id in {r.id for r in pending}
        (audit,) = [a for a in audits(ctx, "replay dlq") if not a.dry_run]
        assert audit.reason == "db failover" and audit.outcome == "replayed"
        assert {uuid.UUID(i).hex for i in audit.affected_ids} == planned

        assert d.relay.run_once() == 2
        d.drain()
        inbox = {r.event_id: r for r in rows(ctx, inbox_dedup, inbox_dedup.c.consumer_group == intake.CONSUMER_GROUP)}
        assert set(inbox) == events and {r.result_digest for r in inbox.values()} == {"ready"}
        ready = {r.id: r.next_action_at for r in rows(ctx, generation_tasks) if r.next_action_at is not None}
        assert set(ready) == set(reset_tasks)
        assert len(rows(ctx, dead_letters)) == 3  # nothing died again

        # the same plan again: every letter is already replayed, nothing is re-published
        again = ok_json(
            cli(pg_url, data, "replay", "dlq", "--plan", str(plan), "--reason", "db failover", "--yes", "--json")
        )
        assert again["result"]["replayed"] == [] and again["result"]["outcome"] == "nothing"
        assert [s["reason"].startswith("already replayed") for s in again["result"]["skipped"]] == [True, True]
        assert d.relay.run_once() == 0
        assert {r.event_id: r.processed_at for r in rows(ctx, inbox_dedup)} == {
            e: r.processed_at for e, r in inbox.items()
        }
        remaining = ok_json(cli(pg_url, data, "replay", "dlq", "--dry-run", "--json"))
        assert remaining["total"] == 1 and remaining["items"][0]["actor"] == "on_generation_queued"
        assert [a.outcome for a in audits(ctx, "replay dlq")] == ["dry_run"] * 4 + ["replayed", "nothing", "dry_run"]
    ctx.close()


def test_dlq_replay_of_an_already_processed_message_has_no_second_effect(tmp_path: Path, pg_url: str) -> None:
    """A relay that dies between enqueue and commit publishes an event twice; the first copy is processed, the
    second fails on its duplicate check until it is dead. Replaying that letter is acknowledged as a duplicate."""
    ctx = make_context(tmp_path / "data", pg_url)
    with Dramatiq(ctx) as d:
        (task,) = queue_tasks(ctx, "acme", 1)
        failpoints.configure("relay.before_commit=raise@1")
        with pytest.raises(FailpointError):
            d.relay.run_once()  # enqueued, then "crashed": the row stays PENDING
        failpoints.reset()
        lost: list[int] = []

        def duplicate_check_fails() -> None:
            if not lost:
                raise ConnectionResetError("connection lost after the dedup check")

        failpoints.enable("consume.duplicate", duplicate_check_fails)
        assert d.relay.run_once() == 1  # the same event, published again
        d.drain()
        (letter,) = rows(ctx, dead_letters)
        (first,) = rows(ctx, inbox_dedup)
        assert first.event_id == uuid.UUID(letter.message_id) and first.result_digest == "ready"
        (before,) = rows(ctx, generation_tasks)
        lost.append(1)  # the database is back

        out = ok_json(
            cli(pg_url, tmp_path / "data", "replay", "dlq", "--reason", "connection storm", "--yes", "--json")
        )
        assert [r["event_id"] for r in out["result"]["replayed"]] == [letter.message_id]
        assert d.relay.run_once() == 1
        d.drain()
        (after,) = rows(ctx, generation_tasks)
        assert (after.next_action_at, after.version) == (before.next_action_at, before.version)
        assert [(r.event_id, r.processed_at) for r in rows(ctx, inbox_dedup)] == [(first.event_id, first.processed_at)]
        (letter_after,) = rows(ctx, dead_letters)
        assert letter_after.replayed_at is not None and letter_after.seen_count == 1
    ctx.close()


class RefuseAll(dramatiq.Middleware):
    """A broker that rejects every enqueue while `refusing` is set (e.g. a message it cannot accept)."""

    def __init__(self) -> None:
        self.refusing = True

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int) -> None:
        if self.refusing:
            raise Refused(f"queue full: message {message.message_id} rejected")


class Refused(dramatiq.middleware.MiddlewareError):
    pass


def test_outbox_dead_rows_are_republished_once(tmp_path: Path, pg_url: str) -> None:
    ctx = make_context(tmp_path / "data", pg_url)
    data = tmp_path / "data"
    with Dramatiq(ctx) as d:
        refuse = RefuseAll()
        d.broker.add_middleware(refuse)
        tasks = queue_tasks(ctx, "acme", 2)
        d.relay.retry_backoff_s = 0  # retry at once: the ten failed attempts need no waiting
        for _ in range(10):
            assert d.relay.run_batch().failed == 2
        dead = rows(ctx, outbox_events)
        assert {(r.status, r.publish_attempts) for r in dead} == {("DEAD", 10)}
        assert d.relay.run_once() == 0

        preview = ok_json(
            cli(
                pg_url,
                data,
                "replay",
                "outbox",
                "--actor",
                "on_generation_queued",
                "--error-class",
                "Refused",
                "--since",
                "1h",
                "--dry-run",
                "--json",
            )
        )
        assert preview["total"] == 2
        assert set(preview["items"][0]) == {
            "id",
            "event_type",
            "target",
            "aggregate_id",
            "status",
            "publish_attempts",
            "last_error",
            "created_at",
            "available_at",
        }
        assert ok_json(cli(pg_url, data, "replay", "outbox", "--actor", "nobody", "--dry-run", "--json"))["total"] == 0
        assert cli(pg_url, data, "replay", "outbox", "--reason", "queue drained").exit_code == 4
        assert cli(pg_url, data, "replay", "outbox", "--since", "yesterday-ish", "--dry-run").exit_code == 2

        refuse.refusing = False
        plan = tmp_path / "outbox-plan.json"
        saved = cli(pg_url, data, "replay", "outbox", "--plan-out", str(plan))
        assert saved.exit_code == 0 and f"plan saved to {plan}: 2 row(s)" in saved.stdout
        out = ok_json(
            cli(pg_url, data, "replay", "outbox", "--plan", str(plan), "--reason", "queue drained", "--yes", "--json")
        )
        assert {r["id"] for r in out["result"]["republished"]} == {str(r.id) for r in dead}
        assert {(r.status, r.publish_attempts) for r in rows(ctx, outbox_events)} == {("PENDING", 0)}
        assert d.relay.run_once() == 2
        d.drain()
        assert {r.aggregate_id for r in rows(ctx, inbox_dedup)} == set(tasks)

        again = ok_json(
            cli(pg_url, data, "replay", "outbox", "--plan", str(plan), "--reason", "queue drained", "--yes", "--json")
        )
        assert again["result"]["republished"] == []
        assert {s["reason"] for s in again["result"]["skipped"]} == {"status is PUBLISHED, not DEAD"}
        assert ok_json(cli(pg_url, data, "replay", "outbox", "--reason", "again", "--yes", "--json"))["total"] == 0
        assert d.relay.run_once() == 0 and len(rows(ctx, inbox_dedup)) == 2
        audit = [a for a in audits(ctx, "replay outbox") if a.reason == "queue drained"]
        assert [(a.outcome, len(a.affected_ids)) for a in audit] == [("republished", 2), ("nothing", 0)]
    ctx.close()


def _job_body(sim: Any, job_id: str, *, echo_request_key: bool) -> bytes:
    body = dict(sim.state.get(job_id))
    if not echo_request_key:
        body.pop("request_key")  # like Runway or fal: the callback names the job, not our request key
    return json.dumps(body).encode()


def _deliver(ctx: AppContext, body: bytes, msg_id: str) -> None:
    headers = sign_webhook([SECRET], msg_id, ctx.clock.now(), body)
    assert ctx.callbacks.receive("sim", headers, body).stored == 1


def test_orphans_rematch_the_raced_callback_and_report_the_foreign_job(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=31, job_seconds=30) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        data = tmp_path / "data"
        (task,) = create_tasks(ctx, 1)
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))

        # The vendor calls back while our submit response is being recorded. The callback transaction looks for
        # the job's attempt before the submit transaction has stored the job id, and commits after that
        # transaction's rematch looked for orphans: the event stays an orphan although its job is ours.
        caller: dict[str, threading.Thread] = {}
        looked, go = threading.Event(), threading.Event()

        def hold_the_insert(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if threading.current_thread() is caller.get("t") and statement.lstrip().upper().startswith(
                "INSERT INTO PROVIDER_EVENTS"
            ):
                looked.set()
                assert go.wait(30)

        def callback_during_submit() -> None:
            (job,) = sim.truth()["jobs"]
            body = _job_body(sim, job["id"], echo_request_key=False)
            caller["t"] = threading.Thread(target=_deliver, args=(ctx, body, f"msg-{job['id']}"))
            caller["t"].start()
            assert looked.wait(30)

        sa.event.listen(ctx.engine, "before_cursor_execute", hold_the_insert)
        failpoints.enable("submit.after_call", callback_during_submit)
        drv.round()
        failpoints.reset()
        go.set()
        caller["t"].join(30)
        (attempt,) = rows(ctx, task_attempts)
        assert attempt.provider_job_id is not None
        (raced,) = rows(ctx, provider_events)
        assert raced.orphan and raced.provider_job_id == attempt.provider_job_id

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
        foreign = created.json()["id"]
        _deliver(ctx, _job_body(sim, foreign, echo_request_key=True), f"msg-{foreign}")
        outbox_before = len(rows(ctx, outbox_events))

        preview = ok_json(cli(pg_url, data, "replay", "orphans", "--dry-run", "--json"))
        assert preview["total"] == 2 and {i["job_id"] for i in preview["items"]} == {attempt.provider_job_id, foreign}
        assert preview["result"]["outcome"] == "dry_run" and len(preview["result"]["rematched"]) == 1
        assert cli(pg_url, data, "replay", "orphans", "--actor", "x", "--dry-run").exit_code == 2
        assert len(rows(ctx, outbox_events)) == outbox_before

        out = ok_json(
            cli(pg_url, data, "replay", "orphans", "--provider", "sim", "--reason", "callback race", "--yes", "--json")
        )
        (matched,) = out["result"]["rematched"]
        assert (matched["id"], matched["attempt_id"], matched["task_id"]) == (str(raced.id), str(attempt.id), str(task))
        assert [s["job_id"] for s in out["result"]["still_orphan"]] == [foreign]
        fixed = {r.id: r for r in rows(ctx, provider_events)}
        assert (fixed[raced.id].orphan, fixed[raced.id].matched_attempt_id) == (False, attempt.id)
        emitted = rows(
            ctx,
            outbox_events,
            outbox_events.c.event_type == "provider.status.observed",
            outbox_events.c.status == "PENDING",
        )
        assert [e.payload["provider_event_id"] for e in emitted] == [str(raced.id)]
        drv.round()  # the reducer takes the re-emitted observation like any other
        raced_events = rows(ctx, task_state_events, task_state_events.c.source_event_id == raced.dedup_key)
        assert [e.source for e in raced_events] == ["callback"]
        settled = len(rows(ctx, outbox_events))

        again = ok_json(cli(pg_url, data, "replay", "orphans", "--reason", "callback race", "--yes", "--json"))
        assert again["total"] == 1 and again["result"]["rematched"] == []
        assert [s["job_id"] for s in again["result"]["still_orphan"]] == [foreign]
        assert len(rows(ctx, outbox_events)) == settled  # nothing emitted a second time
        audit = [a for a in audits(ctx, "replay orphans") if not a.dry_run]
        assert [(a.outcome, a.affected_ids) for a in audit] == [("rematched", [str(raced.id)]), ("nothing", [])]
        ctx.close()
