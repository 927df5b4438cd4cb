"""Each runbook of docs/runbooks.md, run as written: a database seeded into the runbook's situation by real work
(a parked SUBMIT_UNKNOWN, dead letters, a duplicate charge with the vendor's invoice, a review backlog), then
the runbook's own commands — parsed from the document, in its order — through the real root command, each
checked against what the runbook says the operator will see. A command added to or changed in a runbook fails
here until the test runs and checks it.

Placeholders in the document (`ID`, `ALERT`, `ITEM`, `T`, `...`) are filled in as an operator would, from the
seeded rows or from an earlier command's output. Between steps the test does what the runbook leaves to the
running engine (the relay publishing replayed letters) or to the operator outside the CLI."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from aivedio_cli.main import app
from aivedio_engine.db.tables import alerts, assets, dead_letters, generation_tasks, task_attempts
from aivedio_engine.services.liveness import NO_ENGINE
from aivedio_engine.testing import failpoints
from tests.cli.test_ledger_cli import _write_invoice
from tests.cli.test_reconcile_cli import config_file
from tests.cli.test_replay_cli import Dramatiq, poison, queue_tasks
from tests.flow.test_late_submit import FROZEN_S, _stall_then_finish
from tests.flow.test_output_fetch import FETCH, MEDIA, HoldingPump, envelope, pending
from tests.support.app import make_context
from tests.support.cli import Cli
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.seeding import Seeded
from tests.support.sim import running_sim

pytestmark = pytest.mark.postgres
RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
NOBODY = "no engine process has written a heartbeat recently"
#: commands a runbook names that a test cannot run (interactive)
NOT_RUN = {"aivedio tui"}


def runbook(title: str) -> list[str]:
    """The `aivedio …` commands of one runbook's steps (its symptom line left out), in the document's order, each
    with its whitespace collapsed (a command may wrap onto the next line of the document)."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    sections = {s.split("\n", 1)[0].strip(): s for s in re.split(r"^## Runbook: ", text, flags=re.M)[1:]}
    body = sections[title]
    steps = body[re.search(r"^\d\. ", body, flags=re.M).start() :]  # type: ignore[union-attr]
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", steps) if span.startswith("aivedio ")]


Check = Callable[[Result], None]
Step = tuple[str, int, Check]


@dataclass
class Runbook:
    """Runs one runbook's commands in order: each step is a command as the document spells it, its exit code and
    a check of its output. `fill` maps placeholders to values; checks may add to it."""

    title: str
    run: Callable[[list[str]], Result]
    fill: dict[str, str] = field(default_factory=dict)

    def __call__(self, *steps: Step) -> None:
        commands = [c for c in runbook(self.title) if c not in NOT_RUN]
        assert commands == [command for command, _, _ in steps], "the runbook's commands changed"
        for command, code, check in steps:
            args = [self.fill.get(a, a) for a in shlex.split(command)[1:]]
            result = self.run(args)
            assert result.exit_code == code, (command, result.exit_code, result.stdout, result.stderr)
            check(result)


class WideCli(Cli):
    """The tests' CLI at a 250-column "terminal": whole ids on one line, so a check can look for them."""

    def __call__(self, *args: str) -> Result:
        return CliRunner().invoke(app, [*self.args, *args], env={"COLUMNS": "250"})


def shows(*fragments: str, stream: str = "stdout") -> Check:
    def check(r: Result) -> None:
        text = getattr(r, stream)
        missing = [f for f in fragments if f not in text]
        assert not missing, (missing, text)

    return check


def holds(check_id: str) -> Check:
    """`aivedio audit --check X` reports the invariant X holding (status ok, no violations)."""

    def check(r: Result) -> None:
        assert re.search(rf"{re.escape(check_id)}[\s│]+ok[\s│]+0[\s│]", r.stdout), r.stdout

    return check


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a Rich table, each cell's wrapped lines joined by a space."""
    found: list[list[str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            continue
        if cells[0] or not found:
            found.append(cells)
        else:  # a continuation line of the row above
            found[-1] = [f"{a} {b}".strip() for a, b in zip(found[-1], cells, strict=True)]
    return found


def rows(engine: Any, stmt: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(stmt))


# --- a stuck SUBMIT_UNKNOWN ------------------------------------------------------------------------------------


def test_runbook_a_stuck_submit_unknown(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the vendor made the job but the answer was lost, and it cannot look jobs up by our request key: the
    # engine's lookups decide nothing and it parks the task at the end of the window rather than pay twice
    with running_sim(seed=43, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60], "park_after_s": 120},
        )
        (task,) = create_tasks(ctx, 1, credits=1000, prefix="a")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        parked = sa.select(generation_tasks.c.parked_reason).where(generation_tasks.c.id == task)
        drv.run_until(lambda: rows(ctx.engine, parked)[0][0] is not None, max_rounds=40)
        (attempt,) = rows(ctx.engine, sa.select(task_attempts).where(task_attempts.c.task_id == task))
        assert attempt.submit_state == "UNKNOWN" and attempt.lookup_count >= 1
        cli = WideCli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))
        book = Runbook("a stuck SUBMIT_UNKNOWN", lambda args: cli(*args), {"ID": str(task), "...": "INC-123"})

        def alert_listed(r: Result) -> None:
            (line,) = r.stdout.splitlines()
            assert f"submit_unknown_parked  task:{task}" in line and "  OPEN  critical  " in line
            book.fill["ALERT"] = line.split()[0]

        def task_shown(r: Result) -> None:
            assert f"key={attempt.provider_request_key}" in r.stdout  # what the vendor console is searched by
            assert f"lookups={attempt.lookup_count}" in r.stdout and "parked_reason: ambiguous submit" in r.stdout
            assert "submit_unknown_parked (ACKNOWLEDGED)" in r.stdout

        def cannot_look_up(r: Result) -> None:
            assert "note: sim cannot look jobs up by request key" in r.stdout and "aivedio tasks show ID" in r.stdout

        def previewed(r: Result) -> None:
            assert str(task) in r.stdout and "dry run: 1 task(s) would be looked up; nothing changed" in r.stdout
            cannot_look_up(r)

        def still_parked(r: Result) -> None:
            assert re.search(rf"{task}[\s│]+sim[\s│]+still_unknown[\s│]+parked", r.stdout)
            assert "still_unknown=1" in r.stdout
            cannot_look_up(r)

        def canceled(r: Result) -> None:
            assert f"{task}: SUBMIT_UNKNOWN → CANCEL_REQUESTED" in r.stdout
            assert NO_ENGINE in r.stderr  # step 0's point: the cancel waits for a live engine

        book(
            ("aivedio status", 1, shows(NOBODY)),
            ("aivedio alerts list --rule submit_unknown_parked", 0, alert_listed),
            ('aivedio alerts ack ALERT --reason "INC-123" --yes', 0, shows("acknowledged")),
            ("aivedio tasks list --status SUBMIT_UNKNOWN", 0, shows(str(task), "parked: ambiguous submit")),
            ("aivedio tasks show ID", 0, task_shown),
            ("aivedio reconcile --task ID --dry-run", 0, previewed),
            ('aivedio reconcile --task ID --reason "INC-123" --yes', 0, still_parked),
            ("aivedio tasks cancel ID --reason ... --yes", 0, canceled),
        )
        assert len(sim.truth()["jobs"]) == 1  # nothing in the runbook paid for a second job
        ctx.close()


# --- a parked submit settled by hand ---------------------------------------------------------------------------


def test_runbook_a_parked_submit_settled_by_hand(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # two parked submits at a vendor that cannot look jobs up: one whose job was made and its answer lost, one
    # whose connection dropped before any job existed; the operator finds the first in the console, not the second
    with running_sim(seed=53, job_seconds=3, lookup=False) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60], "park_after_s": 150},
        )
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        made, lost = [], []
        for into, fault, prefix in ((made, "ambiguous=1", "m"), (lost, "reset=1", "l")):
            sim.set_faults(fault)
            into.extend(create_tasks(ctx, 1, credits=1000, prefix=prefix))
            drv.round()
        (made_id,), (lost_id,) = made, lost
        parked = sa.select(generation_tasks.c.id).where(generation_tasks.c.parked_reason.is_not(None))
        drv.run_until(lambda: len(rows(ctx.engine, parked)) == 2, max_rounds=60)
        (job,) = sim.truth()["jobs"]
        (attempt,) = rows(ctx.engine, sa.select(task_attempts).where(task_attempts.c.task_id == made_id))
        assert job["request_key"] == attempt.provider_request_key
        cli = WideCli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))
        book = Runbook(
            "a parked submit settled by hand",
            lambda args: cli(*args),
            {"ID": str(made_id), "JOB": job["id"], "...": "INC-123"},
        )

        def task_shown(r: Result) -> None:
            assert f"key={attempt.provider_request_key}" in r.stdout  # what the console is searched by

        def bind_previewed(r: Result) -> None:
            assert f"dry run: task {made_id} (SUBMIT_UNKNOWN, parked;" in r.stdout
            assert f"bind job {job['id']}, succeeded at sim" in r.stdout and "nothing changed" in r.stdout

        def bound(r: Result) -> None:
            assert re.search(rf"{made_id}[\s│]+sim[\s│]+found[\s│]+bound_job", r.stdout), r.stdout
            book.fill["ID"] = str(lost_id)  # the other parked task: its job is nowhere in the console

        def not_created_previewed(r: Result) -> None:
            assert f"dry run: task {lost_id} (SUBMIT_UNKNOWN, parked;" in r.stdout
            assert "close the attempt as never created" in r.stdout and "nothing changed" in r.stdout

        def not_created(r: Result) -> None:
            assert re.search(rf"{lost_id}[\s│]+sim[\s│]+not_created[\s│]+new_attempt_scheduled", r.stdout), r.stdout

        def alerts_listed(r: Result) -> None:
            lines = r.stdout.splitlines()
            assert len(lines) == 2, lines
            (line,) = [x for x in lines if f"task:{lost_id}" in x]
            book.fill["ALERT"] = line.split()[0]

        book(
            ("aivedio tasks show ID", 0, task_shown),
            ("aivedio reconcile --task ID --job-id JOB --dry-run", 0, bind_previewed),
            ('aivedio reconcile --task ID --job-id JOB --reason "INC-123" --yes', 0, bound),
            ("aivedio reconcile --task ID --not-created --dry-run", 0, not_created_previewed),
            ('aivedio reconcile --task ID --not-created --reason "INC-123" --yes', 0, not_created),
            ("aivedio alerts list --rule submit_unknown_parked", 0, alerts_listed),
            ('aivedio alerts resolve ALERT --reason "INC-123" --yes', 0, shows("resolved")),
        )
        states = dict(rows(ctx.engine, sa.select(generation_tasks.c.id, generation_tasks.c.status)))
        assert states[lost_id] == "RETRY_WAIT" and states[made_id] != "SUBMIT_UNKNOWN"
        assert rows(ctx.engine, parked) == [] and len(sim.truth()["jobs"]) == 1
        ctx.close()


# --- a DLQ spike -----------------------------------------------------------------------------------------------


def database_down() -> BaseException:
    """The error a consumer really gets while PostgreSQL is unreachable (a port nothing listens on)."""
    try:
        sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none").connect()
    except sa.exc.OperationalError as exc:
        return exc
    raise AssertionError("a connection to port 1 succeeded")


def test_runbook_a_dlq_spike(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # dead letters from the real delivery path (relay → broker → worker → consumer) whose commits fail until the
    # retries run out: two while the database is down, one on a statement timeout that must not be replayed blind
    monkeypatch.chdir(tmp_path)  # the runbook's plan file, dlq.json, is relative
    ctx = make_context(tmp_path / "data", pg_url)
    outage = database_down()
    failure: dict[str, Callable[[], BaseException] | None] = {"make": None}
    poison(failure)
    try:
        with Dramatiq(ctx) as d:
            failure["make"] = lambda: outage
            down = queue_tasks(ctx, "acme", 2)
            assert d.relay.run_once() == 2
            d.drain()
            failure["make"] = lambda: TimeoutError("canceling statement due to statement timeout")
            (slow,) = queue_tasks(ctx, "globex", 1)
            assert d.relay.run_once() == 1
            d.drain()
            failure["make"] = None
            letters = {r.message["args"][0]["aggregate_id"]: r for r in rows(ctx.engine, sa.select(dead_letters))}
            assert set(letters) == {str(t) for t in (*down, slow)}
            assert letters[str(down[0])].error.startswith("OperationalError: (psycopg.OperationalError) connection")

            cli = WideCli(ctx, monkeypatch)
            book = Runbook("a DLQ spike", lambda args: cli(*args))

            def listed(r: Result) -> None:
                assert "3 dead letter(s) match" in r.stdout and "dry run: would replay 3" in r.stdout
                for task, letter in letters.items():  # each letter with its task and its error class
                    line = next(ln for ln in r.stdout.splitlines() if str(letter.id) in ln)
                    assert task in line and letter.error.split(":")[0] in line

            def planned(r: Result) -> None:
                assert "2 dead letter(s) match" in r.stdout and "plan saved to dlq.json" in r.stdout
                ids = set(json.loads((tmp_path / "dlq.json").read_text())["ids"])
                assert ids == {str(letters[str(t)].id) for t in down}  # the outage's letters, not the timeout's

            def replayed(r: Result) -> None:
                assert "replayed: 2, skipped: 0, failed: 0" in r.stdout and NO_ENGINE in r.stderr
                # what step 0 asks for: an engine that publishes and consumes the replayed events
                assert d.relay.run_once() == 2
                d.drain()

            book(
                ("aivedio status", 1, shows(NOBODY)),
                ("aivedio replay dlq --dry-run", 0, listed),
                ('aivedio replay dlq --error-class "OperationalError" --plan-out dlq.json', 0, planned),
                ('aivedio replay dlq --plan dlq.json --reason "INC-124 db failover" --yes', 0, replayed),
                ("aivedio audit --check I6.3", 0, holds("I6.3")),
                ("aivedio replay outbox --dry-run", 0, shows("0 DEAD outbox row(s) match")),
            )
            pending = rows(ctx.engine, sa.select(dead_letters.c.id).where(dead_letters.c.replayed_at.is_(None)))
            assert [p.id for p in pending] == [letters[str(slow)].id]
            assert rows(
                ctx.engine, sa.select(generation_tasks.c.id).where(generation_tasks.c.next_action_at.is_not(None))
            )
    finally:
        failpoints.reset()
        ctx.close()


# --- a duplicate charge ----------------------------------------------------------------------------------------


def test_runbook_a_duplicate_charge(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a vendor without lookup by request key: the ambiguous submit is resubmitted at the end of the window (as
    # configured), and both jobs are billed; a second task runs cleanly and its charge is left off the invoice
    monkeypatch.chdir(tmp_path)  # the runbook's invoice, vendor.csv, is relative
    with running_sim(seed=42, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60], "park_after_s": 120, "resubmit_without_lookup": True},
        )
        (twice,) = create_tasks(ctx, 1, credits=1000, prefix="a")
        drv = Driver(ctx, sim, Pump(ctx))
        drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"))
        sim.set_faults("")
        (clean,) = create_tasks(ctx, 1, credits=1000, prefix="b")
        drv.run_until(lambda: drv.all_in("SUCCEEDED"))
        attempts = {
            (a.task_id, a.attempt_no): a
            for a in rows(ctx.engine, sa.select(task_attempts).order_by(task_attempts.c.id))
        }
        assert attempts[(twice, 2)].resubmitted_after_unknown and attempts[(twice, 1)].provider_job_id is None
        jobs = {j["request_key"]: j for j in sim.truth()["jobs"]}
        assert len(jobs) == 3 and all(j["billed"] for j in jobs.values())
        billed = [jobs[attempts[k].provider_request_key] for k in ((twice, 1), (twice, 2))]
        _write_invoice(
            tmp_path / "vendor.csv",
            [
                {
                    "provider": "sim",
                    "job_id": j["id"],
                    "amount": "2.00",  # what the task was charged: no credit is owed, only the duplicate
                    "currency": "USD",
                    "billed_at": j["created_at"],
                    "request_key": j["request_key"],
                    "vendor_note": "",
                }
                for j in billed
            ],
        )
        clean_job = attempts[(clean, 1)].provider_job_id
        cli = WideCli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))
        book = Runbook("a duplicate charge", lambda args: cli(*args), {"ID": str(twice), "T": "tenant-a"})

        def charged_once(r: Result) -> None:
            assert sorted(row[1] for row in table_rows(r.stdout)) == ["RESERVE", "SETTLE"], r.stdout
            assert "2 ledger row(s)" in r.stderr

        def two_jobs(r: Result) -> None:
            # the engine never learnt the first job's id: the invoice is where its bill shows
            assert "#1 sim FAILED_BEFORE_ACCEPT job=-" in r.stdout and "resubmitted after unknown" in r.stdout
            assert "resubmit_without_lookup" in r.stdout

        def reported(r: Result) -> None:
            assert re.search(rf"duplicate_job[\s│]+{billed[0]['id']}", r.stdout), r.stdout
            assert "duplicates: 1, orphans: 0, not attributable: 0, missing charges: 1, credits: 0" in r.stdout
            assert f"missing: sim job {clean_job} (task {clean}, SUCCEEDED; attempt SUCCEEDED)" in r.stdout

        def booked(r: Result) -> None:
            assert "booked: 1, already booked: 0, not attributable: 0" in r.stdout

        def with_vendor_amount(r: Result) -> None:
            (row,) = [row for row in table_rows(r.stdout) if row[1] == "ADJUSTMENT"]
            _, _, amount, vendor, task_id, _, _, reason = row
            assert (amount, vendor, task_id) == ("0.00", "2.00 USD", str(twice))
            assert reason.startswith(f"invoice duplicate_job: sim job {billed[0]['id']} billed 2.00 USD")
            assert reason.endswith("invoice 2026-11"), reason

        def credited(r: Result) -> None:
            assert "(+12)" in r.stdout and "booked" in r.stdout
            again = cli(
                *(book.fill.get(a, a) for a in shlex.split(adjust)[1:])
            )  # the runbook's promise: a repeat does nothing
            assert again.exit_code == 0 and "already booked under adjustment:manual:INC-125" in again.stdout

        adjust = (
            'aivedio ledger adjust --tenant T --task ID --amount 12 --business-key INC-125 --reason "refund duplicate'
            ' job" --yes'
        )
        book.fill["T"] = "tenant-a"
        book(
            ("aivedio ledger entries --task ID", 0, charged_once),
            ("aivedio tasks show ID", 0, two_jobs),
            ("aivedio audit --check I4.2", 0, holds("I4.2")),
            ("aivedio ledger reconcile --invoice vendor.csv", 0, reported),
            ('aivedio ledger reconcile --invoice vendor.csv --apply --reason "invoice 2026-11" --yes', 0, booked),
            ("aivedio ledger entries --task ID", 0, with_vendor_amount),
            (adjust, 0, credited),
        )
        ctx.close()


# --- a reviewer backlog ----------------------------------------------------------------------------------------


def test_runbook_a_reviewer_backlog(seeder: Callable[..., Seeded]) -> None:
    # outputs held by the moderation term; the second one's media failed past its budget (its derivatives are
    # marked FAILED to stand in for that): it has nothing playable to approve
    s = seeder({"fox1": "a red fox at dawn", "fox2": "a fox in the snow", "boat": "a paper boat"})
    assert (s.task("fox1").status, s.task("fox2").status, s.task("boat").status) == (
        "MANUAL_REVIEW",
        "MANUAL_REVIEW",
        "SUCCEEDED",
    )
    s.execute(assets.update().where(assets.c.parent_asset_id == s.task("fox2").output_asset_id).values(status="FAILED"))
    first, second = (str(s.review_item(name).id) for name in ("fox1", "fox2"))
    book = Runbook("a reviewer backlog", lambda args: s.cli(*args), {"ITEM": first, "...": "INC-126 checked"})

    def pending(r: Result) -> None:
        lines = r.stdout.splitlines()
        held = sorted((s.review_item(name) for name in ("fox1", "fox2")), key=lambda i: (i.created_at, i.id))
        assert [ln.split()[0] for ln in lines] == [str(i.id) for i in held]  # oldest first
        assert all("  pending  " in ln and "(MANUAL_REVIEW)" in ln for ln in lines)
        assert r.stderr.strip() == "2 review item(s)"

    def approved(r: Result) -> None:
        assert f"approved review item {first}" in r.stdout and "→ SUCCEEDED, settled at 2" in r.stdout
        assert s.task("fox1").status == "SUCCEEDED"
        book.fill["ITEM"] = second  # step 3 is about the item with nothing playable

    def rejected(r: Result) -> None:
        assert f"rejected review item {second}" in r.stdout and "→ FAILED_FINAL, settled at 0" in r.stdout
        assert s.task("fox2").status == "FAILED_FINAL"

    book(
        ("aivedio review list --state pending", 0, pending),
        ("aivedio review claim ITEM --as alice", 0, shows(f"claimed review item {first}", "for alice until")),
        ("aivedio review approve ITEM --as alice --reason ... --yes", 0, approved),
        ("aivedio review approve ITEM --as alice --reason ... --yes", 4, shows("no playable output", stream="stderr")),
        ("aivedio review reject ITEM --as alice --reason ... --yes", 0, rejected),
    )


# --- an object store outage ------------------------------------------------------------------------------------


def test_runbook_an_object_store_outage(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # two outputs come home while our store breaks for real (the fs store's staging directory replaced by a file,
    # as a lost mount or a full disk would do): one task's fetch cannot write its raw output, the other's media
    # step cannot upload its derivatives. Both steps raise, as their actors would; nothing is spent or failed
    with running_sim(seed=44, job_seconds=1) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        fetching, processing = create_tasks(ctx, 2, credits=1000, prefix="st")
        drv = Driver(ctx, sim, HoldingPump(ctx, (FETCH, MEDIA)))
        drv.run_until(lambda: len(pending(ctx, FETCH)) == 2, max_rounds=30)
        row_of = {r.aggregate_id: r for r in pending(ctx, FETCH)}
        assert ctx.output_fetch.handle(envelope(row_of[processing])) == "stored 1"
        (media_row,) = pending(ctx, MEDIA)
        staging = Path(ctx.storage.root) / ".tmp"  # type: ignore[attr-defined]
        shutil.rmtree(staging)
        staging.write_bytes(b"not a directory")
        with pytest.raises(OSError):
            ctx.output_fetch.handle(envelope(row_of[fetching]))
        with pytest.raises(OSError):
            ctx.media.handle(envelope(media_row))
        status = sa.select(generation_tasks.c.id, generation_tasks.c.status)
        assert dict(rows(ctx.engine, status)) == {fetching: "OUTPUT_FETCHING", processing: "POST_PROCESSING"}
        cli = WideCli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))
        book = Runbook("an object store outage", lambda args: cli(*args))

        def alert_listed(r: Result) -> None:
            (line,) = r.stdout.splitlines()  # one alert for the store, not one per task
            assert "storage_unavailable  storage:fs " in line and "  OPEN  critical  " in line, line
            book.fill["ALERT"] = line.split()[0]

        def store_fails(r: Result) -> None:
            assert re.search(r"^FAIL\s+storage\s+check failed: .*objects/\.tmp", r.stdout, flags=re.M), r.stdout

        def store_fixed(r: Result) -> None:  # step 3's second command; then the operator fixes the store
            assert str(processing) in r.stdout and str(fetching) not in r.stdout
            staging.unlink()
            staging.mkdir()

        def store_passes(r: Result) -> None:
            assert re.search(r"^ok\s+storage\s+fs .*: write, read, delete", r.stdout, flags=re.M), r.stdout
            assert "failed: role worker, role sweeper" in r.stdout  # no engine runs in this test; storage passes
            # what the engine does by itself from here: the broker's retries (or the sweeper's re-drive) run
            # each held step again, and the tasks move on
            assert ctx.output_fetch.handle(envelope(row_of[fetching])) == "stored 1"
            assert ctx.media.handle(envelope(media_row)) == "succeeded"
            drv.pump.hold = frozenset()  # type: ignore[attr-defined]
            drv.run_until(lambda: drv.all_in("SUCCEEDED"), max_rounds=30)

        def none_fetching(r: Result) -> None:
            assert str(fetching) not in r.stdout and str(processing) not in r.stdout, r.stdout

        def resolved(r: Result) -> None:
            assert "resolved" in r.stdout
            assert [a.status for a in rows(ctx.engine, sa.select(alerts))] == ["RESOLVED"]

        book(
            ("aivedio alerts list --rule storage_unavailable", 0, alert_listed),
            ('aivedio alerts ack ALERT --reason "INC-127" --yes', 0, shows("acknowledged")),
            ("aivedio doctor", 1, store_fails),
            ("aivedio tasks list --status OUTPUT_FETCHING", 0, shows(str(fetching))),
            ("aivedio tasks list --status POST_PROCESSING", 0, store_fixed),
            ("aivedio doctor", 1, store_passes),
            ("aivedio tasks list --status OUTPUT_FETCHING", 0, none_fetching),
            ('aivedio alerts resolve ALERT --reason "INC-127" --yes', 0, resolved),
        )
        ctx.close()


# --- a platform cost alert -------------------------------------------------------------------------------------


def test_runbook_a_platform_cost_alert(seeder: Callable[..., Seeded]) -> None:
    # an output held for a person that nobody decides: the review SLA rejects it, the tenant is not charged and
    # the vendor's bill for the clip is booked as platform cost
    s = seeder({"fox1": "a red fox at dawn", "boat": "a paper boat"})
    assert s.task("fox1").status == "MANUAL_REVIEW"
    s.advance(s.ctx.settings.review.sla_s + 1)
    assert s.ctx.sweeper.sweep().review_sla_decided == 1
    task_id = str(s.tasks["fox1"])
    book = Runbook("a platform cost alert", lambda args: s.cli(*args), {"ID": task_id, "...": "INC-128 understood"})

    def listed(r: Result) -> None:
        (line,) = r.stdout.splitlines()
        assert f"platform_cost  task:{task_id}" in line and "not charged to the tenant" in line, line
        assert "review_sla_passed" in line
        book.fill["ALERT"] = line.split()[0]

    def entries(r: Result) -> None:
        by_type = {c[1]: c for c in table_rows(r.stdout) if len(c) > 3 and c[1] in ("RESERVE", "RELEASE", "ADJUSTMENT")}
        assert sorted(by_type) == ["ADJUSTMENT", "RELEASE", "RESERVE"], r.stdout
        adjustment = by_type["ADJUSTMENT"]
        assert (adjustment[2], adjustment[3]) == ("0.00", "2.00"), adjustment  # 0 credits; the vendor cost 2

    book(
        ("aivedio alerts list --rule platform_cost", 0, listed),
        ("aivedio ledger entries --task ID", 0, entries),
        ("aivedio tasks show ID", 0, shows("review_sla_passed", "FAILED_FINAL")),
        ("aivedio alerts resolve ALERT --reason ... --yes", 0, shows("resolved")),
    )
    assert s.task("fox1").status == "FAILED_FINAL" and s.task("boat").status == "SUCCEEDED"


# --- a duplicate paid job --------------------------------------------------------------------------------------


def test_runbook_a_duplicate_paid_job(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker frozen inside its send past every bound: attempt 1 was closed as never created and attempt 2 made
    # the task's video; then the frozen request reached the vendor, which made a second job
    failpoints.reset()
    try:
        with running_sim(seed=3, job_seconds=10) as sim:
            ctx = sim_context(tmp_path, sim, pg_url, sweeper={"idle_grace_s": 60})
            task_id, worker, drv = _stall_then_finish(ctx, sim, "submit.after_deadline_check", FROZEN_S)
            drv.pump.run()  # the cancel the late answer asked for
            assert worker.outcome == "duplicate"
            first = rows(ctx.engine, sa.select(task_attempts).where(task_attempts.c.attempt_no == 1))[0]
            (late,) = [j for j in sim.truth()["jobs"] if j["request_key"] == first.provider_request_key]
            assert late["canceled"]
            cli = WideCli(ctx, monkeypatch, config=config_file(ctx, tmp_path / "aivedio.toml"))
            book = Runbook("a duplicate paid job", lambda args: cli(*args), {"ID": str(task_id), "...": "INC-129"})

            def listed(r: Result) -> None:
                (alert,) = [" ".join(r.stdout.split())]  # one alert, wrapped by the terminal
                assert f"duplicate_paid_job task:{task_id}" in alert and " OPEN critical " in alert, alert
                assert f"sim job {late['id']} was made by attempt #1's request" in alert
                assert alert.endswith("cancel asked; cancel at the vendor: canceled"), alert  # step 2's answer
                book.fill["ALERT"] = alert.split()[0]

            def booked(r: Result) -> None:
                (adjustment,) = [c for c in table_rows(r.stdout) if len(c) > 3 and c[1] == "ADJUSTMENT"]
                assert (adjustment[2], adjustment[3]) == ("0.00", "2.00 credits"), adjustment  # the job's worth
                key = adjustment[5].replace(" ", "")  # a wrapped cell
                assert key == f"platform_cost:{task_id}:{first.id}:duplicate_paid_job", adjustment

            def resolved(r: Result) -> None:
                assert "resolved" in r.stdout
                duplicates = sa.select(alerts.c.status).where(alerts.c.rule == "duplicate_paid_job")
                assert [a.status for a in rows(ctx.engine, duplicates)] == ["RESOLVED"]

            book(
                ("aivedio alerts list --rule duplicate_paid_job", 0, listed),
                ("aivedio ledger entries --task ID", 0, booked),
                # no engine runs in this test, and no work waits for one: only warnings
                ("aivedio doctor", 0, shows(NOBODY, "all checks ok or warnings only")),
                ("aivedio alerts resolve ALERT --reason ... --yes", 0, resolved),
            )
            assert sim.truth()["calls"]["cancel"] == 1
            ctx.close()
    finally:
        failpoints.reset()
