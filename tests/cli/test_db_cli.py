"""`aivedio db upgrade|status` through the real root command: exit codes, JSON shape, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.db import migrate

ALL = [m.name for m in migrate.discover()]
runner = CliRunner()


def _db(url: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["--set", f"database.url={url}", "db", *args])


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.postgres
def test_upgrade_then_status(pg_empty_url: str) -> None:
    first = _db(pg_empty_url, "upgrade")
    assert first.exit_code == 0, first.output
    assert [line.removeprefix("applied ") for line in first.stdout.splitlines()] == ALL

    again = _db(pg_empty_url, "upgrade", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["applied"] == []

    status = _db(pg_empty_url, "status", "--json")
    assert status.exit_code == 0, status.output
    rows = json.loads(status.stdout)
    assert [(r["name"], r["state"]) for r in rows] == [(n, "applied") for n in ALL]
    assert all(set(r) == {"name", "state", "sha256", "applied_at"} and r["applied_at"] for r in rows)

    table = _db(pg_empty_url, "status")
    assert table.exit_code == 0 and ALL[0] in table.stdout


@pytest.mark.postgres
def test_checksum_mismatch_is_exit_1_with_one_line(
    pg_empty_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = Path(shutil.copytree(migrate.DEFAULT_MIGRATIONS_DIR, tmp_path / "migrations"))
    monkeypatch.setenv(migrate.MIGRATIONS_DIR_ENV, str(copy))
    assert _db(pg_empty_url, "upgrade").exit_code == 0
    edited = copy / ALL[0]
    edited.write_text(edited.read_text() + "-- edited\n")

    upgrade = _db(pg_empty_url, "upgrade")
    assert upgrade.exit_code == 1
    assert ALL[0] in _one_error_line(upgrade.stderr)

    status = _db(pg_empty_url, "status", "--json")
    assert status.exit_code == 1
    assert {r["name"]: r["state"] for r in json.loads(status.stdout)}[ALL[0]] == "checksum_mismatch"
    assert ALL[0] in _one_error_line(status.stderr)


def test_unreachable_database_is_exit_1_with_one_line() -> None:
    result = _db("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", "upgrade")
    assert result.exit_code == 1
    assert "127.0.0.1" in _one_error_line(result.stderr)


def test_password_is_masked_in_errors() -> None:
    result = _db("postgresql+psycopg://postgres:hunter2@127.0.0.1:1/nowhere", "status")
    assert result.exit_code == 1
    assert "hunter2" not in result.output


def test_invalid_url_is_usage_error() -> None:
    result = _db("not a url", "status")
    assert result.exit_code == 2
    _one_error_line(result.stderr)


def test_embedded_upgrade_with_default_settings_creates_the_data_dir() -> None:
    result = runner.invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert Path(".aivedio/aivedio.db").is_file()

    status = runner.invoke(app, ["db", "status", "--json"])
    assert status.exit_code == 0, status.output
    rows = json.loads(status.stdout)
    assert [(r["name"], r["state"]) for r in rows] == [(migrate.embedded_marker()[0], "applied")]
    assert "up to date" in runner.invoke(app, ["db", "upgrade"]).stdout
