"""`aivedio serve`: role parsing, the schema guard, and an embedded relay+worker process stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services import intake
from aivedio_engine.worker.runtime import ROLES, parse_roles
from tests.chaos.support import (
    effects_per_task,
    inbox_count,
    insert_queued_events,
    insert_tasks,
    insert_tenant,
    install_effect_counter,
    outbox_statuses,
    wait_until,
)


@pytest.mark.parametrize(
    ("text", "roles"),
    [
        ("all", set(ROLES)),
        ("relay", {"relay"}),
        (" Relay , worker,", {"relay", "worker"}),
        ("api,all", set(ROLES)),
    ],
)
def test_parse_roles(text: str, roles: set[str]) -> None:
    assert parse_roles(text) == roles


@pytest.mark.parametrize("text", ["", " , ", "relay,bogus"])
def test_parse_roles_rejects_unknown_or_empty(text: str) -> None:
    with pytest.raises(ValueError, match="--role"):
        parse_roles(text)


def test_serve_rejects_an_unknown_role_as_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--role", "relay,bogus"])
    assert result.exit_code == 2
    assert "unknown role bogus" in result.output


@pytest.mark.postgres
def test_serve_refuses_a_postgres_schema_that_is_not_migrated(pg_empty_url: str) -> None:
    result = CliRunner().invoke(
        app, ["--set", f"database.url={pg_empty_url}", "--set", "mode=distributed", "serve", "--role", "relay"]
    )
    assert result.exit_code == 1
    assert "aivedio db upgrade" in result.output


def test_embedded_serve_consumes_the_outbox_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    n = 50
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}))
    migrate.upgrade(ctx.engine)
    with ctx.engine.begin() as conn:
        install_effect_counter(conn)
        tenant = insert_tenant(conn)
        insert_queued_events(conn, tenant, insert_tasks(conn, tenant, n))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={tmp_path}", "serve", "--role", "relay,worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: inbox_count(ctx.engine, intake.CONSUMER_GROUP) == n or proc.poll() is not None,
            30,
            "the embedded process to consume every event",
        )
        assert proc.poll() is None, log.read_text()
        wait_until(lambda: outbox_statuses(ctx.engine) == {OutboxStatus.PUBLISHED.value: n}, 10, "all PUBLISHED")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert set(effects_per_task(ctx.engine).values()) == {1}
    assert "signal SIGTERM received; shutting down" in log.read_text()
    ctx.close()
