"""`aivedio alerts list|ack|resolve`: acknowledging keeps an alert unresolved and absorbs repeats of its
condition; resolving closes it so a repeat raises a new one; every change is audited; unknown ids are reported."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.config import load_settings
from aivedio_engine.db.alerts import Rule, raise_alert
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import alerts, audit_log
from aivedio_engine.domain.status import AlertSeverity

runner = CliRunner()
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _cli(data: Path, *args: str) -> Any:
    return runner.invoke(app, ["--set", f"data_dir={data}", *args])


def _engine(data: Path) -> sa.Engine:
    return make_engine(load_settings(None, {"data_dir": str(data)}))


def _raise(data: Path, rule: Rule, key: str, at: datetime = T0) -> None:
    engine = _engine(data)
    try:
        with engine.begin() as conn:
            raise_alert(
                conn,
                rule,
                AlertSeverity.WARNING,
                dedup_key=key,
                message=f"{rule.value} {key}",
                now=at,
                subject_type="task",
                subject_id=key,
            )
    finally:
        engine.dispose()


def _rows(data: Path, table: sa.Table) -> list[Any]:
    engine = _engine(data)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(table)))
    finally:
        engine.dispose()


def _ids(data: Path) -> dict[str, uuid.UUID]:
    return {r.dedup_key: r.id for r in _rows(data, alerts) if r.status != "RESOLVED"}


def test_ack_absorbs_repeats_and_resolve_lets_the_condition_raise_again(tmp_path: Path) -> None:
    assert _cli(tmp_path, "db", "upgrade").exit_code == 0
    _raise(tmp_path, Rule.SUBMIT_UNKNOWN_PARKED, "t1")
    _raise(tmp_path, Rule.MEDIA_FAILED, "t2")
    ids = _ids(tmp_path)
    listed = json.loads(_cli(tmp_path, "alerts", "list", "--json").stdout)
    assert sorted(a["subject_id"] for a in listed) == ["t1", "t2"]
    assert {a["status"] for a in listed} == {"OPEN"}
    cut = _cli(tmp_path, "alerts", "list", "--limit", "1")
    assert len(cut.stdout.splitlines()) == 1 and cut.stderr.strip() == "1 of 2 alert(s) shown; --limit shows more"

    no_reason = _cli(tmp_path, "alerts", "ack", str(ids["t1"]), "--yes")
    assert no_reason.exit_code == 2 and "--reason is required" in no_reason.stderr
    dry = _cli(tmp_path, "alerts", "ack", str(ids["t1"]), "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["changed"] == [str(ids["t1"])]
    assert {r.status for r in _rows(tmp_path, alerts)} == {"OPEN"}

    acked = _cli(tmp_path, "alerts", "ack", str(ids["t1"]), "--reason", "INC-7 on it", "--yes", "--json")
    assert acked.exit_code == 0, acked.output
    _raise(tmp_path, Rule.SUBMIT_UNKNOWN_PARKED, "t1", at=T0.replace(minute=5))  # the condition repeats
    (t1,) = [r for r in _rows(tmp_path, alerts) if r.dedup_key == "t1"]
    assert t1.status == "ACKNOWLEDGED" and t1.acknowledged_by and t1.last_seen_at.minute == 5
    assert [
        a["subject_id"] for a in json.loads(_cli(tmp_path, "alerts", "list", "--status", "open", "--json").stdout)
    ] == ["t2"]

    again = _cli(tmp_path, "alerts", "ack", str(ids["t1"]), "--reason", "again", "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["skipped"] == [
        {"id": str(ids["t1"]), "why": "already ACKNOWLEDGED"}
    ]

    both = _cli(tmp_path, "alerts", "resolve", str(ids["t1"]), str(ids["t2"]), "--reason", "fixed", "--yes")
    assert both.exit_code == 0 and "resolved 2 alert(s)" in both.stdout
    assert json.loads(_cli(tmp_path, "alerts", "list", "--json").stdout) == []
    _raise(tmp_path, Rule.SUBMIT_UNKNOWN_PARKED, "t1", at=T0.replace(minute=9))  # still happening: a new alert
    assert [r.status for r in _rows(tmp_path, alerts) if r.dedup_key == "t1"].count("OPEN") == 1

    audit = [(r.command, r.outcome, r.dry_run, r.reason) for r in _rows(tmp_path, audit_log)]
    assert ("alerts ack", "dry_run", True, None) in audit
    assert ("alerts ack", "acknowledged", False, "INC-7 on it") in audit
    assert ("alerts ack", "nothing_to_do", False, "again") in audit
    assert ("alerts resolve", "resolved", False, "fixed") in audit


def test_unknown_ids_and_bad_filters_are_clear_errors(tmp_path: Path) -> None:
    assert _cli(tmp_path, "db", "upgrade").exit_code == 0
    _raise(tmp_path, Rule.MEDIA_FAILED, "t3")
    (known,) = _ids(tmp_path).values()
    ghost = uuid.uuid4()
    gone = _cli(tmp_path, "alerts", "resolve", str(ghost), "--reason", "x", "--yes", "--json")
    assert gone.exit_code == 5 and json.loads(gone.stdout)["skipped"] == [{"id": str(ghost), "why": "not found"}]
    partial = _cli(tmp_path, "alerts", "resolve", str(known), str(ghost), "--reason", "x", "--yes")
    assert partial.exit_code == 3 and f"{ghost}: not found" in partial.stdout
    bad_id = _cli(tmp_path, "alerts", "ack", "nope", "--reason", "x", "--yes")
    assert bad_id.exit_code == 2 and bad_id.stderr.startswith("error: not a valid alert id")
    bad_status = _cli(tmp_path, "alerts", "list", "--status", "closed")
    assert bad_status.exit_code == 2 and "status must be one of" in bad_status.stderr
    assert _cli(tmp_path, "alerts", "list").stdout.strip() == "no unresolved alerts"
