"""`aivedio ledger balance|entries|adjust|reconcile` through the real root command, on ledgers written by real
generations against the sim provider; the invoice is the sim's own record of what it billed."""

from __future__ import annotations

import csv
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import audit_log, credit_ledger, generation_tasks, task_attempts, tenants
from tests.support.balance import balance_of as stripes_total
from tests.support.flow import Driver, create_tasks, sim_context
from tests.support.pump import Pump
from tests.support.sim import running_sim

pytestmark = pytest.mark.postgres
runner = CliRunner()
OPERATOR = "oncall@example"


@pytest.fixture(autouse=True)
def _operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIVEDIO_OPERATOR", OPERATOR)


def cli(url: str, data_dir: Path, *args: str) -> Any:
    # a wide "terminal", so human tables show whole ids
    return runner.invoke(
        app, ["--set", f"database.url={url}", "--set", f"data_dir={data_dir}", *args], env={"COLUMNS": "250"}
    )


def ok_json(result: Any, code: int = 0) -> Any:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def rows(ctx: AppContext, table: sa.Table, *where: Any) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(table).where(*where).order_by(table.c.id)).all())


def balance_of(ctx: AppContext, tenant_id: Any) -> Decimal:
    with ctx.engine.connect() as conn:
        return stripes_total(conn, tenant_id)


def audits(ctx: AppContext, command: str) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(audit_log)
                .where(audit_log.c.command == command)
                .order_by(audit_log.c.created_at, audit_log.c.id)
            ).all()
        )


def test_balance_entries_and_adjust(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=41, job_seconds=3) as sim:
        ctx = sim_context(tmp_path, sim, pg_url)
        data = tmp_path / "data"
        running, canceled = create_tasks(ctx, 2, credits=1000, prefix="a")
        (tenant,) = rows(ctx, tenants)
        ctx.generations.cancel(tenant.id, canceled)  # before dispatch: the reservation is released
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING", "CANCELED"))
        (estimate,) = {r.estimated_cost for r in rows(ctx, generation_tasks)}

        b = ok_json(cli(pg_url, data, "ledger", "balance", "--tenant", "tenant-a", "--json"))
        assert set(b) == {
            "tenant_id",
            "tenant",
            "credit_balance",
            "ledger_sum",
            "consistent",
            "reserved",
            "entries",
            "by_type",
        }
        assert (b["tenant_id"], b["consistent"], b["entries"]) == (str(tenant.id), True, 4)
        assert Decimal(b["credit_balance"]) == Decimal(b["ledger_sum"]) == 1000 - estimate
        assert Decimal(b["reserved"]) == estimate
        assert {k: Decimal(v) for k, v in b["by_type"].items()} == {
            "ADJUSTMENT": 1000,
            "RESERVE": -2 * estimate,
            "RELEASE": estimate,
        }
        assert cli(pg_url, data, "ledger", "balance", "--tenant", str(tenant.id)).exit_code == 0
        assert cli(pg_url, data, "ledger", "balance", "--tenant", "nobody").exit_code == 5

        entries = ok_json(cli(pg_url, data, "ledger", "entries", "--tenant", "tenant-a", "--json"))
        assert [e["entry_type"] for e in entries][-1] == "ADJUSTMENT"  # newest first: the initial grant is last
        assert set(entries[0]) == {
            "id",
            "created_at",
            "tenant_id",
            "task_id",
            "attempt_id",
            "entry_type",
            "amount",
            "unit",
            "business_key",
            "reason",
            "created_by",
            "vendor_amount",  # an invoice line's own amount and currency (None for engine rows)
            "vendor_currency",
        }
        of_task = ok_json(cli(pg_url, data, "ledger", "entries", "--task", str(canceled), "--json"))
        assert sorted(e["entry_type"] for e in of_task) == ["RELEASE", "RESERVE"]
        assert len(ok_json(cli(pg_url, data, "ledger", "entries", "--limit", "1", "--json"))) == 1
        cut = cli(pg_url, data, "ledger", "entries", "--tenant", "tenant-a", "--limit", "1")
        assert cut.stderr.strip() == "1 of 4 ledger row(s) shown; --limit shows more"
        assert cli(pg_url, data, "ledger", "entries", "--task", str(uuid.uuid4())).exit_code == 5
        table = cli(pg_url, data, "ledger", "entries", "--tenant", "tenant-a")
        assert table.exit_code == 0 and "RELEASE" in table.stdout and f"release:{canceled}" in table.stdout

        before = balance_of(ctx, tenant.id)
        adjust = (
            "ledger",
            "adjust",
            "--tenant",
            "tenant-a",
            "--task",
            str(running),
            "--amount",
            "25",
            "--business-key",
            "TICKET-1",
        )
        dry = ok_json(cli(pg_url, data, *adjust, "--dry-run", "--json"))
        assert (dry["outcome"], dry["dry_run"], dry["booked"]) == ("would_book", True, False)
        assert Decimal(dry["balance_after"]) == before + 25
        assert cli(pg_url, data, *adjust).exit_code == 2  # no --reason
        assert cli(pg_url, data, *adjust, "--reason", "goodwill").exit_code == 4  # no terminal, no --yes
        assert balance_of(ctx, tenant.id) == before

        booked = ok_json(cli(pg_url, data, *adjust, "--reason", "goodwill", "--yes", "--json"))
        assert set(booked) == {
            "tenant_id",
            "tenant",
            "amount",
            "business_key",
            "outcome",
            "dry_run",
            "booked",
            "duplicate",
            "balance_before",
            "balance_after",
            "entry_id",
        }
        assert (booked["outcome"], booked["booked"], booked["business_key"]) == (
            "booked",
            True,
            "adjustment:manual:TICKET-1",
        )
        assert balance_of(ctx, tenant.id) == before + 25
        (entry,) = rows(ctx, credit_ledger, credit_ledger.c.business_key == "adjustment:manual:TICKET-1")
        assert (entry.entry_type, entry.amount, entry.task_id, entry.created_by, entry.reason) == (
            "ADJUSTMENT",
            25,
            running,
            OPERATOR,
            "goodwill",
        )

        told = cli(pg_url, data, *adjust, "--reason", "goodwill", "--yes")
        assert told.exit_code == 0 and "already booked under adjustment:manual:TICKET-1" in told.stdout
        again = ok_json(cli(pg_url, data, *adjust, "--reason", "goodwill", "--yes", "--json"))
        assert (again["outcome"], again["booked"], again["duplicate"], again["entry_id"]) == (
            "duplicate",
            False,
            True,
            str(entry.id),
        )
        assert balance_of(ctx, tenant.id) == before + 25
        assert len(rows(ctx, credit_ledger)) == 5

        reused = cli(
            pg_url,
            data,
            "ledger",
            "adjust",
            "--tenant",
            "tenant-a",
            "--amount",
            "30",
            "--business-key",
            "TICKET-1",
            "--reason",
            "goodwill",
            "--yes",
        )
        assert reused.exit_code == 4 and "already used" in reused.stderr
        overdraft = cli(
            pg_url,
            data,
            "ledger",
            "adjust",
            "--tenant",
            "tenant-a",
            "--amount",
            "-100000",
            "--business-key",
            "TICKET-2",
            "--reason",
            "clawback",
            "--yes",
        )
        assert overdraft.exit_code == 4 and "cannot go negative" in overdraft.stderr
        assert balance_of(ctx, tenant.id) == before + 25
        for bad in (["--amount", "abc"], ["--amount", "0"], ["--amount", "1.123456789"]):
            assert (
                cli(
                    pg_url,
                    data,
                    "ledger",
                    "adjust",
                    "--tenant",
                    "tenant-a",
                    *bad,
                    "--business-key",
                    "X",
                    "--reason",
                    "r",
                    "--yes",
                ).exit_code
                == 2
            )
        assert (
            cli(
                pg_url,
                data,
                "ledger",
                "adjust",
                "--tenant",
                "nobody",
                "--amount",
                "1",
                "--business-key",
                "X",
                "--reason",
                "r",
                "--yes",
            ).exit_code
            == 5
        )

        # down to exactly zero is allowed; the cache still equals the ledger sum
        zero = ok_json(
            cli(
                pg_url,
                data,
                "ledger",
                "adjust",
                "--tenant",
                "tenant-a",
                "--amount",
                f"-{before + 25}",
                "--business-key",
                "TICKET-3",
                "--reason",
                "close account",
                "--yes",
                "--json",
            )
        )
        assert (zero["outcome"], Decimal(zero["balance_after"])) == ("booked", 0)
        assert ok_json(cli(pg_url, data, "ledger", "balance", "--tenant", "tenant-a", "--json"))["consistent"]

        assert [(a.outcome, a.dry_run, a.actor) for a in audits(ctx, "ledger adjust")] == [
            ("dry_run", True, OPERATOR),
            ("booked", False, OPERATOR),
            ("duplicate", False, OPERATOR),
            ("duplicate", False, OPERATOR),
            ("refused", False, OPERATOR),
            ("refused", False, OPERATOR),
            ("booked", False, OPERATOR),
        ]
        assert audits(ctx, "ledger adjust")[1].affected_ids == [str(entry.id)]
        ctx.close()


def _write_invoice(path: Path, lines: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["provider", "job_id", "amount", "currency", "billed_at", "request_key", "vendor_note"]
        )
        writer.writeheader()
        writer.writerows(lines)


def test_reconcile_finds_duplicates_orphans_and_missing_and_books_once(tmp_path: Path, pg_url: str) -> None:
    # A vendor without lookup by request key: an ambiguous submit can only be resolved by waiting out the window
    # and resubmitting (a second paid job is possible, and happens here) — or by the user canceling meanwhile.
    with running_sim(seed=42, faults="ambiguous=1", job_seconds=3, lookup=False) as sim:
        ctx = sim_context(
            tmp_path,
            sim,
            pg_url,
            provider={"supports_lookup_by_request_key": False},
            reconcile={"lookup_after_s": [10, 60, 300], "park_after_s": 120, "resubmit_without_lookup": True},
        )
        data = tmp_path / "data"
        resubmitted, canceled = create_tasks(ctx, 2, credits=1000, prefix="a")
        drv = Driver(ctx, sim, Pump(ctx, stop_at_fetch=True))
        drv.run_until(lambda: drv.all_in("SUBMIT_UNKNOWN"))
        sim.set_faults("")
        (tenant,) = rows(ctx, tenants)
        ctx.generations.cancel(tenant.id, canceled)
        (normal,) = create_tasks(ctx, 1, credits=1000, prefix="b")
        drv.run_until(lambda: drv.all_in("OUTPUT_FETCHING", "CANCELED"))
        assert {r.id: r.status for r in rows(ctx, generation_tasks)} == {
            resubmitted: "OUTPUT_FETCHING",
            canceled: "CANCELED",
            normal: "OUTPUT_FETCHING",
        }
        attempts = {(r.task_id, r.attempt_no): r for r in rows(ctx, task_attempts)}
        assert attempts[(resubmitted, 2)].resubmitted_after_unknown
        assert attempts[(resubmitted, 1)].provider_job_id is None and attempts[(canceled, 1)].provider_job_id is None

        # the vendor's invoice: every job it billed, one of them twice; the normal task's job left off (missing);
        # and a charge for a job nobody here ever sent
        truth = sim.truth()["jobs"]
        by_key = {j["request_key"]: j for j in truth}
        job = {
            name: by_key[attempts[key].provider_request_key]["id"]
            for name, key in {
                "first": (resubmitted, 1),
                "second": (resubmitted, 2),
                "canceled": (canceled, 1),
                "normal": (normal, 1),
            }.items()
        }
        assert all(j["billed"] for j in truth) and len(truth) == 4
        line = {
            j["id"]: {
                "provider": "sim",
                "job_id": j["id"],
                "amount": "0.40",
                "currency": "USD",
                "billed_at": j["created_at"],
                "request_key": j["request_key"],
                "vendor_note": "x",
            }
            for j in truth
        }
        foreign = {
            "provider": "sim",
            "job_id": "job-from-elsewhere",
            "amount": "0.40",
            "currency": "USD",
            "billed_at": truth[0]["created_at"],
            "request_key": "",
            "vendor_note": "",
        }
        invoice = tmp_path / "invoice.csv"
        _write_invoice(
            invoice, [line[job["first"]], line[job["second"]], line[job["canceled"]], line[job["second"]], foreign]
        )
        balance_before = balance_of(ctx, tenant.id)
        ledger_before = len(rows(ctx, credit_ledger))

        report = ok_json(cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice), "--json"))
        assert report["schema"] == "aivedio.ledger.reconcile.v1" and report["apply"] is None
        assert report["invoice"]["lines"] == 5 and report["invoice"]["billed"] == {"USD": "2.00"}
        dups = {(d["kind"], d["job_id"], d["line"]): d for d in report["duplicates"]}
        assert set(dups) == {("duplicate_job", job["first"], 2), ("duplicate_line", job["second"], 5)}
        assert dups[("duplicate_job", job["first"], 2)]["task_id"] == str(resubmitted)
        assert dups[("duplicate_line", job["second"], 5)]["attempt_id"] == str(attempts[(resubmitted, 2)].id)
        orphans = {o["job_id"]: o for o in report["orphans"]}
        assert set(orphans) == {job["canceled"], "job-from-elsewhere"}
        assert orphans[job["canceled"]]["task_id"] == str(canceled) and orphans[job["canceled"]]["business_key"]
        elsewhere = orphans["job-from-elsewhere"]
        assert elsewhere["task_id"] is None and elsewhere["business_key"] is None
        assert [m["job_id"] for m in report["missing"]] == [job["normal"]]
        assert set(report["duplicates"][0]) == {
            "kind",
            "line",
            "provider",
            "job_id",
            "amount",
            "currency",
            "billed_at",
            "request_key",
            "tenant_id",
            "task_id",
            "attempt_id",
            "note",
            "business_key",
            "booking",
        }

        human = cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice))
        assert human.exit_code == 0, human.output
        assert "duplicates: 2, orphans: 2, not attributable: 1, missing charges: 1" in human.stdout
        assert cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice), "--apply").exit_code == 2
        refused = cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice), "--apply", "--reason", "r")
        assert refused.exit_code == 4
        dry = ok_json(
            cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice), "--apply", "--dry-run", "--json")
        )
        assert len(dry["apply"]["would_book"]) == 3 and dry["apply"]["booked"] == []
        assert len(rows(ctx, credit_ledger)) == ledger_before

        # apply: one 0-credit ADJUSTMENT per bookable finding; the foreign charge needs a human (exit 3)
        applied = ok_json(
            cli(
                pg_url,
                data,
                "ledger",
                "reconcile",
                "--invoice",
                str(invoice),
                "--apply",
                "--reason",
                "invoice 2026-11",
                "--yes",
                "--json",
            ),
            code=3,
        )
        keys = {
            f"adjustment:invoice:sim:{job['first']}",
            f"adjustment:invoice:sim:{job['second']}:repeat2",
            f"adjustment:invoice:sim:{job['canceled']}",
        }
        assert set(applied["apply"]["booked"]) == keys and applied["apply"]["not_bookable"] == ["line 6"]
        booked = rows(ctx, credit_ledger, credit_ledger.c.business_key.in_(keys))
        assert {(r.entry_type, r.amount, r.tenant_id, r.created_by) for r in booked} == {
            ("ADJUSTMENT", 0, tenant.id, OPERATOR)
        }
        # the vendor's amount is a figure of its own now, not only words in the reason
        assert {(r.vendor_amount, r.vendor_currency) for r in booked} == {(Decimal("0.40"), "USD")}
        assert {r.business_key: r.attempt_id for r in booked} == {
            f"adjustment:invoice:sim:{job['first']}": attempts[(resubmitted, 1)].id,
            f"adjustment:invoice:sim:{job['second']}:repeat2": attempts[(resubmitted, 2)].id,
            f"adjustment:invoice:sim:{job['canceled']}": attempts[(canceled, 1)].id,
        }
        assert balance_of(ctx, tenant.id) == balance_before  # the tenant is not charged for our duplicates

        again = ok_json(
            cli(
                pg_url,
                data,
                "ledger",
                "reconcile",
                "--invoice",
                str(invoice),
                "--apply",
                "--reason",
                "invoice 2026-11",
                "--yes",
                "--json",
            ),
            code=3,
        )
        assert again["apply"]["booked"] == [] and set(again["apply"]["already_booked"]) == keys
        assert len(rows(ctx, credit_ledger)) == ledger_before + 3
        audit = [a for a in audits(ctx, "ledger reconcile") if not a.dry_run]
        assert [(a.outcome, sorted(a.affected_ids)) for a in audit] == [
            ("partial", sorted(str(r.id) for r in booked)),
            ("partial", []),
        ]

        other = ok_json(
            cli(pg_url, data, "ledger", "reconcile", "--invoice", str(invoice), "--provider", "kling", "--json")
        )
        assert other["invoice"]["considered"] == 0 and other["duplicates"] == other["orphans"] == []
        broken = tmp_path / "broken.csv"
        broken.write_text("provider,job_id,amount,billed_at\nsim,j1,lots,2026-11-30T10:00:00Z\n")
        bad = cli(pg_url, data, "ledger", "reconcile", "--invoice", str(broken))
        assert bad.exit_code == 2 and "line 2" in bad.stderr
        ctx.close()


def test_a_long_missing_list_says_how_much_of_it_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    from aivedio_cli.ledger_cmd import MISSING_SHOWN, _show_report
    from aivedio_engine.services.ledger_ops import ReconcileReport

    missing = [
        {
            "provider": "sim",
            "job_id": f"job-{i}",
            "task_id": uuid.UUID(int=i),
            "task_status": "CANCELED",
            "submit_state": "SUCCEEDED",
        }
        for i in range(MISSING_SHOWN + 8)
    ]
    _show_report(ReconcileReport(0, 0, ["sim"], {}, None, [], missing))
    lines = capsys.readouterr().out.splitlines()
    assert sum(1 for ln in lines if ln.startswith("  missing: ")) == MISSING_SHOWN
    assert lines[-1] == f"  {MISSING_SHOWN} of {MISSING_SHOWN + 8} missing charges shown; --json lists all"
    assert (
        f"(task {uuid.UUID(int=0)}, CANCELED; attempt SUCCEEDED)" in lines[2]
    )  # the task's status, then the attempt's
