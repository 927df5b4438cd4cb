"""The conventions every command follows (README, "CLI"): one-line errors with fixed exit codes, a JSON error object
under --json, plain decimals, one duration syntax, help in plain words, full ids, value completion, and a root
command that lists everything without importing it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aivedio_cli import _render
from aivedio_cli.main import COMMANDS, app
from aivedio_engine.testing import failpoints

REPO = Path(__file__).resolve().parents[2]
#: a PostgreSQL nobody listens on: a command that got past its option parsing fails with "database unavailable"
NO_DB = "database.url=postgresql+psycopg://postgres@127.0.0.1:9/nowhere"
runner = CliRunner()


def cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def aivedio(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real entry point in a fresh process: what a terminal sees, tracebacks from threads included."""
    return subprocess.run(
        [sys.executable, "-m", "aivedio_cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# ------------------------------------------------------------------------------------------------ root command
def test_root_help_lists_every_command_with_its_line() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for spec in COMMANDS:
        assert re.search(rf"^  {re.escape(spec.name)} +{re.escape(spec.help)}$", result.stdout, re.M), spec.name


@pytest.mark.parametrize("spec", COMMANDS, ids=lambda s: s.name)
def test_each_listed_line_is_the_start_of_the_commands_own_help(spec) -> None:  # type: ignore[no-untyped-def]
    own = " ".join((spec.load().help or "").split())
    assert own.startswith(spec.help.rstrip(".")), (spec.help, own)


def test_help_texts_are_plain_words() -> None:
    """No Python types (`<list[Path]>`) and no references to internal documents in any command's help."""
    for spec in COMMANDS:
        command = spec.load()
        paths = [[spec.name]]
        paths += [[spec.name, sub] for sub in getattr(command, "commands", {})]
        for path in paths:
            text = runner.invoke(app, [*path, "--help"], terminal_width=200).stdout
            assert not re.search(r"<(str|int|float|bool|Path|list\[)|§|seed \d{3}|DESIGN|anchors", text), (path, text)


# ------------------------------------------------------------------------------------------------ errors
def test_usage_error_is_one_line_and_exit_2() -> None:
    code, out, err = cli("tasks", "list", "--limit", "0")
    assert code == 2 and out == ""
    assert "--limit" in one_error_line(err)


def test_unknown_command_is_one_line_and_exit_2() -> None:
    code, _, err = cli("taks")
    assert code == 2
    assert "No such command 'taks'" in one_error_line(err) and "tasks" in err


def test_errors_under_json_are_a_json_object_on_stdout() -> None:
    code, out, err = cli("tasks", "show", "not-an-id", "--json")
    assert code == 2
    assert json.loads(out) == {"error": "not a task id: 'not-an-id'", "error_type": "bad_id"}
    one_error_line(err)


def test_usage_errors_under_json_too() -> None:
    code, out, _ = cli("generations", "list", "--limit", "0", "--json")
    assert code == 2
    doc = json.loads(out)
    assert doc["error_type"] == "usage" and "--limit" in doc["error"]


def test_service_failure_under_json_keeps_its_exit_code() -> None:
    code, out, err = cli("--set", NO_DB, "tasks", "list", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["error_type"] == "database_unavailable" and doc["error"].startswith("database unavailable")
    one_error_line(err)


def test_bad_port_is_a_usage_error() -> None:
    done = aivedio("serve", "--port", "99999")
    assert done.returncode == 2, done.stderr
    assert "--port" in one_error_line(done.stderr) and "65535" in done.stderr


def test_busy_port_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = ["serve", "--role", "api", "--host", "127.0.0.1", "--port", f"{port}"]
        done = aivedio("--set", f"data_dir={tmp_path}", *serve)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr) == f"error: cannot listen on 127.0.0.1:{port}: the port is already in use"


def test_unexpected_exception_is_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from aivedio_cli import states_cmd

    def boom(*_: object) -> str:
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(states_cmd, "to_mermaid", boom)
    code, _, err = cli("states", "--format", "mermaid")
    assert code == 1
    assert one_error_line(err).startswith("error: unexpected RuntimeError: something broke")


# ------------------------------------------------------------------------------------------------ values
def test_decimals_are_plain_strings_in_json() -> None:
    assert _render.to_json({"amount": Decimal("0E-8"), "big": Decimal("1E+3")}, indent=None) == (
        '{"amount": "0.00000000", "big": "1000"}'
    )


def test_states_json_is_format_json() -> None:
    code, out, _ = cli("states", "--json")
    assert code == 0
    edges = json.loads(out)
    assert edges == json.loads(cli("states", "--format", "json")[1])
    assert edges and set(edges[0]) == {"from", "event", "to"}


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        (["tasks", "list", "--older-than", "90s"], True),
        (["tasks", "list", "--older-than", "10m"], True),
        (["tasks", "list", "--older-than", "1h"], True),
        (["tasks", "list", "--older-than", "3600"], True),
        (["audit", "--grace", "1h"], True),
        (["audit", "--grace", "90s"], True),
        (["storage", "scan", "--grace", "10m"], True),
        (["reconcile", "--older-than", "2h", "--dry-run"], True),
        (["tasks", "tail", "--interval", "2s", "--once"], True),
        (["tasks", "list", "--older-than", "10 minutes"], False),
        (["audit", "--grace", "-5"], False),
        (["storage", "scan", "--grace", "1y"], False),
    ],
)
def test_every_duration_option_takes_the_same_syntax(args: list[str], ok: bool) -> None:
    """Parsed before the database is touched: accepted → the command goes on and finds no database (1);
    refused → a usage error naming the accepted forms (2)."""
    code, _, err = cli("--set", NO_DB, *args)
    if ok:
        assert code == 1 and "database unavailable" in err, err
    else:
        assert code == 2 and "not a duration" in one_error_line(err) and "90s, 10m, 1h" in err


def test_duration_defaults_read_as_durations() -> None:
    text = runner.invoke(app, ["audit", "--help"], terminal_width=200).stdout
    assert "DURATION" in text and "15m" in text


def test_generate_wait_timeout_says_timed_out_in_json(tmp_path: Path) -> None:
    """A generation still moving when --timeout runs out. The submit is held for 3 s (a failpoint): on a fast
    machine the embedded engine renders, fetches and derives the sim's video in under the 1 s given."""
    failpoints.configure("submit.after_call=sleep:3")
    try:
        code, out, err = cli("--set", f"data_dir={tmp_path}", "generate", "a fox", "--wait", "--timeout", "1", "--json")
    finally:
        failpoints.reset()
    doc = json.loads(out)
    assert code == 1, err
    assert doc["error"].startswith("timed out after 1s: generation ") and doc["error_type"] == "timeout"
    assert doc["status"] not in ("SUCCEEDED", "FAILED_FINAL")


# ------------------------------------------------------------------------------------------------ ids
def test_ids_are_never_cut_at_80_columns() -> None:
    from rich.console import Console

    from aivedio_cli.tasks_cmd import id_table

    table = id_table("task_id", "status", "tenant", "provider/model", "try", "updated_at", "note")
    task_id = "0192f3c4-7d1e-7abc-8def-0123456789ab"
    row = ("SUBMIT_UNKNOWN", "acme-productions", "runway/gen4_turbo", "3", "2026-01-01 00:00:00", "x" * 60)
    table.add_row(task_id, *row)
    buffer = StringIO()
    Console(file=buffer, width=80, force_terminal=True, color_system=None).print(table)
    assert task_id in buffer.getvalue()


# ------------------------------------------------------------------------------------------------ completion
def complete(words: str) -> list[str]:
    env = {"_AIVEDIO_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("aivedio"))],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    return done.stdout.split()


def test_completion_of_command_names_and_statuses() -> None:
    assert "tasks" in complete("aivedio ta")
    assert complete("aivedio tasks list --status SUB") == ["SUBMITTED", "SUBMIT_UNKNOWN"]
    assert complete("aivedio generations list --status SUCC") == ["SUCCEEDED"]
    assert complete("aivedio alerts list --status ac") == ["acknowledged"]


def test_completion_of_providers_and_models_from_the_settings() -> None:
    """The default settings offer the `local` provider and its model; a provider added with --set shows up too."""
    assert complete("aivedio generate --provider ") == ["local"]
    assert complete("aivedio generate --model loc") == ["local-v1"]
    added = complete("aivedio --set providers.sim.base_url=http://127.0.0.1:9 generate --provider ")
    assert added == ["local", "sim"]


@pytest.mark.postgres
def test_tenant_names_complete_from_the_database_and_zero_credits_stay_plain(pg_url: str) -> None:
    code, _, err = cli("--set", f"database.url={pg_url}", "tenants", "create", "acme-films", "--credits", "0")
    assert code == 0, err
    assert complete(f"aivedio --set database.url={pg_url} tasks list --tenant acme") == ["acme-films"]
    assert complete(f"aivedio --set database.url={pg_url} ledger entries --tenant zzz") == []
    code, out, err = cli("--set", f"database.url={pg_url}", "ledger", "balance", "--tenant", "acme-films", "--json")
    assert code == 0, err
    assert json.loads(out)["credit_balance"] == "0.00000000" and "E-" not in out
