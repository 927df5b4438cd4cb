"""Liveness: heartbeats written by real `aivedio serve` processes, ages under an injected clock, the role_missing
alert (only while work waits), and the "no engine is running" line of the commands that only enqueue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.tables import alerts, process_heartbeats
from aivedio_engine.services.liveness import NO_ENGINE, HeartbeatWriter, ProcessState
from tests.support.app import FakeClock, make_context, tenant_with_key

ENGINE_ROLES = "relay,worker,scheduler,sweeper"


def wait_for(condition: Any, timeout_s: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")


def _cli(*args: str, data_dir: Path, database_url: str | None = None) -> Any:
    sets = ["--set", f"data_dir={data_dir}"]
    if database_url:
        sets += ["--set", f"database.url={database_url}"]
    return CliRunner().invoke(app, [*sets, *args])


def _status(data_dir: Path, database_url: str | None = None) -> tuple[int, dict[str, Any]]:
    """(exit code, the liveness part of `status --json`: empty before the schema exists)."""
    result = _cli("status", "--json", data_dir=data_dir, database_url=database_url)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)["liveness"] or {}


def _serve(data_dir: Path, log: Path, database_url: str | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={data_dir}"]
    if database_url:
        argv += ["--set", f"database.url={database_url}"]
    argv += ["--set", "liveness.heartbeat_interval_s=0.2", "serve", "--role", ENGINE_ROLES]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def _serve_heartbeats_then_sigterm(data_dir: Path, log: Path, database_url: str | None = None) -> None:
    proc = _serve(data_dir, log, database_url)
    try:

        def mine() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early: {log.read_text()[-2000:]}")
            _, report = _status(data_dir, database_url)
            return next((p for p in report.get("processes", []) if p["pid"] == proc.pid), None)

        first = wait_for(mine, what="the serve process's heartbeat")
        assert first["state"] == "alive" and first["kind"] == "serve"
        assert first["roles"] == sorted(ENGINE_ROLES.split(","))
        # it keeps beating from its own thread: last_seen moves while the process runs
        later = wait_for(lambda: (p := mine()) and p["last_seen"] > first["last_seen"] and p, what="a later heartbeat")
        assert later["started_at"] == first["started_at"] and later["backlog"] is not None
        wait_for(lambda: (p := mine()) and "last pass" in p["activity"].get("sweeper", ""), what="sweeper activity")
        code, report = _status(data_dir, database_url)
        assert code == 0 and report["engine_alive"] is True
        assert {r["role"]: r["alive"] for r in report["roles"]} == {
            "api": 0,
            "relay": 1,
            "worker": 1,
            "scheduler": 1,
            "sweeper": 1,
        }

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _, report = _status(data_dir, database_url)
    row = next(p for p in report["processes"] if p["pid"] == proc.pid)
    assert row["state"] == "stopped" and row["stopped_at"] is not None
    assert report["engine_alive"] is False
    text = _cli("status", data_dir=data_dir, database_url=database_url)
    assert text.exit_code == 0 and "stopped" in text.stdout and str(proc.pid) in text.stdout


def test_serve_writes_heartbeats_and_marks_itself_stopped_on_sigterm(tmp_path: Path) -> None:
    _serve_heartbeats_then_sigterm(tmp_path / "data", tmp_path / "serve.log")


@pytest.mark.postgres
def test_serve_heartbeats_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    _serve_heartbeats_then_sigterm(tmp_path / "data", tmp_path / "serve.log", pg_url)


def test_ages_under_an_injected_clock_alive_then_stale(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = make_context(tmp_path / "data", clock=clock)
    try:
        writer = HeartbeatWriter(
            ctx.engine, clock, ctx.settings, frozenset({"worker", "relay"}), activity=lambda: {"worker": "busy"}
        )
        writer.beat()
        [p] = ctx.liveness.report().processes
        assert p.state is ProcessState.ALIVE and p.beat.activity == {"worker": "busy"}
        clock.advance(ctx.settings.liveness.stale_after_s - 1)
        assert ctx.liveness.report().processes[0].state is ProcessState.ALIVE
        clock.advance(2)
        report = ctx.liveness.report()
        assert report.processes[0].state is ProcessState.STALE and not report.engine_alive
        writer.beat()  # it beats again: alive again
        assert ctx.liveness.report().processes[0].state is ProcessState.ALIVE
        writer.stop()
        assert ctx.liveness.report().processes[0].state is ProcessState.STOPPED
    finally:
        ctx.close()


def _open_role_alerts(ctx: Any) -> dict[str, str]:
    with ctx.engine.connect() as conn:
        rows = conn.execute(sa.select(alerts.c.subject_id, alerts.c.message).where(alerts.c.rule == Rule.ROLE_MISSING))
        return {r.subject_id: r.message for r in rows}


def test_role_missing_is_raised_only_while_work_waits(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = make_context(tmp_path / "data", clock=clock, alerts={"interval_s": 1, "role_missing_s": 60})
    try:
        # an API-only process: it beats, and its heartbeat thread evaluates the rule
        api = HeartbeatWriter(ctx.engine, clock, ctx.settings, frozenset({"api"}), after_beat=None)
        api.beat()
        clock.advance(120)
        api.beat()
        assert ctx.alert_evaluator.roles_if_due() == 0  # nothing waits: a quiet system without workers is fine
        assert _open_role_alerts(ctx) == {}

        who = tenant_with_key(ctx, "t")
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a fox", "model": "local-v1", "duration_s": 2})
        # a worker seen 30 s ago is still within role_missing_s: only the roles never seen are missing
        worker = HeartbeatWriter(ctx.engine, clock, ctx.settings, frozenset({"worker"}))
        worker.beat()
        clock.advance(30)
        assert ctx.alert_evaluator.roles_if_due() == 3
        found = _open_role_alerts(ctx)
        assert set(found) == {"relay", "scheduler", "sweeper"}
        assert "no relay alive (never seen) while 1 item(s) wait" in found["relay"]

        clock.advance(60)  # now the worker too has been gone for role_missing_s
        assert ctx.alert_evaluator.roles_if_due() == 4
        assert set(_open_role_alerts(ctx)) == {"relay", "worker", "scheduler", "sweeper"}
    finally:
        ctx.close()


def test_enqueue_only_commands_say_when_no_engine_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ctx = make_context(data)
    try:
        who = tenant_with_key(ctx, "t")
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a fox", "model": "local-v1", "duration_s": 2})
        # the invariants all hold, but nothing will move: the audit says so instead of a clean bill
        audit = _cli("audit", data_dir=data)
        assert "all checks hold" not in audit.stdout.splitlines()[-1], audit.stdout
        assert "no worker alive while 1 messages wait" in audit.stdout, audit.stdout
        assert "no relay alive while 1 outbox messages wait to be published" in audit.stdout
        stalled = json.loads(_cli("audit", "--json", data_dir=data).stdout)["stalled"]
        assert "no worker alive while 1 messages wait" in stalled
        with ctx.engine.begin() as conn:
            # the relay gave up on it: DEAD, for `replay outbox` to put back
            conn.execute(sa.text("UPDATE outbox_events SET status = 'DEAD', last_error = 'boom'"))
    finally:
        ctx.close()
    replay = _cli("replay", "outbox", "--yes", "--reason", "test", data_dir=data)
    assert replay.exit_code == 0, replay.output
    assert replay.stderr.splitlines().count(NO_ENGINE) == 1, replay.stderr
    # with an engine alive (a fresh heartbeat), the same command says nothing more
    ctx = make_context(data)
    try:
        HeartbeatWriter(ctx.engine, ctx.clock, ctx.settings, frozenset({"relay", "worker"})).beat()
        with ctx.engine.begin() as conn:
            conn.execute(sa.text("UPDATE outbox_events SET status = 'DEAD', last_error = 'boom'"))
            assert conn.execute(sa.select(sa.func.count()).select_from(process_heartbeats)).scalar_one() == 1
    finally:
        ctx.close()
    again = _cli("replay", "outbox", "--yes", "--reason", "test", data_dir=data)
    assert again.exit_code == 0 and NO_ENGINE not in again.stderr, again.output


def test_the_engine_embedded_in_a_command_beats_and_stops_with_it(tmp_path: Path) -> None:
    from aivedio_engine import embedded

    ctx = make_context(tmp_path / "data")
    try:
        with embedded.running(ctx):
            [p] = ctx.liveness.report().processes
            assert p.state is ProcessState.ALIVE and p.beat.kind == "embedded" and p.beat.pid == os.getpid()
            assert set(p.beat.roles) == {"relay", "worker", "scheduler", "sweeper"}
            assert ctx.liveness.engine_alive()
        [p] = ctx.liveness.report().processes
        assert p.state is ProcessState.STOPPED and not ctx.liveness.engine_alive()
    finally:
        ctx.close()
