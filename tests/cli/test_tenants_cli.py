"""`aivedio tenants` and `aivedio keys` follow the mutation conventions: audited, --dry-run changes nothing,
revoking a key needs a reason and, without a terminal, --yes."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.config import load_settings
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import api_keys, audit_log, tenants

runner = CliRunner()


def _cli(data: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--set", f"data_dir={data}", *args])


def _rows(data: Path, table: sa.Table) -> list:  # type: ignore[type-arg]
    engine = make_engine(load_settings(None, {"data_dir": str(data)}))
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(table)))
    finally:
        engine.dispose()


def test_tenant_and_key_lifecycle_is_audited(tmp_path: Path) -> None:
    assert _cli(tmp_path, "db", "upgrade").exit_code == 0
    dry = _cli(tmp_path, "tenants", "create", "acme", "--credits", "5", "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["dry_run"] is True
    assert _rows(tmp_path, tenants) == []

    made = _cli(tmp_path, "tenants", "create", "acme", "--credits", "5", "--reason", "onboarding", "--json")
    tenant_id = json.loads(made.stdout)["tenant_id"]
    key = json.loads(_cli(tmp_path, "keys", "create", "--tenant", tenant_id, "--json").stdout)
    assert key["api_key"].startswith("avk_")

    no_reason = _cli(tmp_path, "keys", "revoke", key["key_id"], "--yes")
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    no_tty = _cli(tmp_path, "keys", "revoke", key["key_id"], "--reason", "leaked")
    assert no_tty.exit_code == 4 and "--yes" in no_tty.output
    assert all(r.revoked_at is None for r in _rows(tmp_path, api_keys))

    revoked = _cli(tmp_path, "keys", "revoke", key["key_id"], "--reason", "leaked", "--yes", "--json")
    assert revoked.exit_code == 0 and json.loads(revoked.stdout)["changed"] is True
    assert all(r.revoked_at is not None for r in _rows(tmp_path, api_keys))

    audit = sorted(_rows(tmp_path, audit_log), key=lambda r: r.id)  # UUIDv7: creation order
    assert [(r.command, r.outcome, r.dry_run) for r in audit] == [
        ("tenants create", "would_create", True),
        ("tenants create", "created", False),
        ("keys create", "created", False),
        ("keys revoke", "revoked", False),
    ]
    assert audit[1].reason == "onboarding" and audit[3].reason == "leaked"
    assert key["api_key"] not in json.dumps([dict(r._mapping) for r in audit], default=str)  # never the key


def test_tenant_upload_cap_is_set_at_create_and_validated(tmp_path: Path) -> None:
    assert _cli(tmp_path, "db", "upgrade").exit_code == 0
    bad = _cli(tmp_path, "tenants", "create", "tiny", "--max-upload-bytes", "0", "--reason", "plan")
    assert bad.exit_code == 2 and _rows(tmp_path, tenants) == []
    made = _cli(tmp_path, "tenants", "create", "tiny", "--max-upload-bytes", "1048576", "--reason", "free plan")
    assert made.exit_code == 0, made.output
    (row,) = _rows(tmp_path, tenants)
    assert row.max_upload_bytes == 1048576
    (audit,) = [r for r in _rows(tmp_path, audit_log) if r.command == "tenants create"]
    assert audit.args["max_upload_bytes"] == 1048576


def _tenant(data: Path, name: str = "acme") -> str:
    assert _cli(data, "db", "upgrade").exit_code == 0
    made = _cli(data, "tenants", "create", name, "--credits", "5", "--reason", "onboarding", "--json")
    return str(json.loads(made.stdout)["tenant_id"])


def test_tenants_update_sets_limits_audited_and_list_shows_them(tmp_path: Path) -> None:
    tid = _tenant(tmp_path)
    listed = json.loads(_cli(tmp_path, "tenants", "list", "--json").stdout)
    assert listed[0]["limits"] == {
        "rate_limit_per_s": None,
        "rate_limit_burst": None,
        "max_concurrency": None,
        "priority_tier": 2,
        "max_upload_bytes": None,
        "retention_outputs_days": None,
        "retention_inputs_days": None,
        "retention_prompts_days": None,
    }
    assert listed[0]["effective"]["rate_limit_per_s"] == 50.0 and listed[0]["effective"]["rate_limit_burst"] == 100

    args = ["--rate-limit", "2.5/s", "--burst", "7", "--max-concurrency", "3", "--tier", "1"]
    dry = _cli(tmp_path, "tenants", "update", tid, *args, "--max-upload-bytes", "4096", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["changed"] is True and json.loads(dry.stdout)["after"]["max_upload_bytes"] == 4096
    (row,) = _rows(tmp_path, tenants)
    assert (row.rate_limit_per_s, row.rate_limit_burst, row.priority_tier) == (None, None, 2)  # dry run: no change

    done = _cli(tmp_path, "tenants", "update", tid, *args, "--reason", "enterprise plan", "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["after"]["rate_limit_burst"] == 7
    (row,) = _rows(tmp_path, tenants)
    assert (row.rate_limit_per_s, row.rate_limit_burst, row.max_concurrency, row.priority_tier) == (2.5, 7, 3, 1)
    listed = json.loads(_cli(tmp_path, "tenants", "list", "--json").stdout)
    assert listed[0]["limits"]["rate_limit_per_s"] == 2.5 and listed[0]["effective"]["max_concurrency"] == 3
    table = runner.invoke(app, ["--set", f"data_dir={tmp_path}", "tenants", "list"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "2.5" in table.stdout and "(default)" in table.stdout  # upload cap: default

    back = _cli(tmp_path, "tenants", "update", tid, "--rate-limit", "default", "--reason", "plan ended", "--yes")
    assert back.exit_code == 0, back.output
    assert "rate_limit_per_s: 2.5 -> default" in back.stdout
    (row,) = _rows(tmp_path, tenants)
    assert row.rate_limit_per_s is None and row.rate_limit_burst == 7

    audit = [r for r in sorted(_rows(tmp_path, audit_log), key=lambda r: r.id) if r.command == "tenants update"]
    assert [(r.outcome, r.dry_run, r.reason) for r in audit] == [
        ("would_update", True, None),
        ("updated", False, "enterprise plan"),
        ("updated", False, "plan ended"),
    ]
    assert audit[1].args["before"]["rate_limit_per_s"] is None and audit[1].args["after"]["rate_limit_per_s"] == 2.5
    assert audit[1].affected_ids == [tid]

    # retention: days of the tenant's own, or the [retention] default (0: kept forever)
    kept = _cli(tmp_path, "tenants", "update", tid, "--retention-outputs", "30", "--retention-prompts", "7",
                "--reason", "enterprise contract", "--yes")  # fmt: skip
    assert kept.exit_code == 0, kept.output
    assert "retention_outputs_days: default -> 30" in kept.stdout
    (row,) = _rows(tmp_path, tenants)
    assert (row.retention_outputs_days, row.retention_inputs_days, row.retention_prompts_days) == (30, None, 7)
    effective = json.loads(_cli(tmp_path, "tenants", "list", "--json").stdout)[0]["effective"]
    assert (effective["retention_outputs_days"], effective["retention_inputs_days"]) == (30, 0)
    bad = _cli(tmp_path, "tenants", "update", tid, "--retention-inputs", "0", "--reason", "x", "--yes")
    assert bad.exit_code == 2 and "--retention-inputs must be > 0" in bad.output


def test_tenants_update_refuses_bad_input_and_changes_nothing(tmp_path: Path) -> None:
    tid = _tenant(tmp_path)
    cases = [
        (["--rate-limit", "0"], 2, "> 0"),
        (["--rate-limit", "fast"], 2, "requests per second"),
        (["--burst", "1.5"], 2, "whole number"),
        (["--tier", "0"], 2, ""),
        (["--tier", "6"], 2, ""),
        ([], 1, "nothing to change"),
    ]
    for extra, code, message in cases:
        r = _cli(tmp_path, "tenants", "update", tid, *extra, "--reason", "x", "--yes")
        assert r.exit_code == code, (extra, r.output)
        assert message in r.output, (extra, r.output)
    no_reason = _cli(tmp_path, "tenants", "update", tid, "--burst", "3", "--yes")
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    no_tty = _cli(tmp_path, "tenants", "update", tid, "--burst", "3", "--reason", "x")
    assert no_tty.exit_code == 4 and "--yes" in no_tty.output
    missing = _cli(tmp_path, "tenants", "update", "0190f0e4-0000-7000-8000-000000000000", "--burst", "3")
    assert missing.exit_code == 2  # no reason: refused before the lookup
    missing = _cli(
        tmp_path, "tenants", "update", "0190f0e4-0000-7000-8000-000000000000", "--burst", "3", "--reason", "x", "--yes"
    )
    assert missing.exit_code == 5 and "not found" in missing.output
    (row,) = _rows(tmp_path, tenants)
    assert (row.rate_limit_burst, row.priority_tier) == (None, 2)
    assert not [r for r in _rows(tmp_path, audit_log) if r.command == "tenants update"]
