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
