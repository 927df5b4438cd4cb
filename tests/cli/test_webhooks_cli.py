"""`aivedio webhooks ...` and `aivedio replay webhooks` through the real root command, on PostgreSQL, with the
real relay and worker delivering to a loopback receiver that verifies every signature."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import audit_log
from tests.support.app import make_context, tenant_with_key
from tests.support.sim import wait_until
from tests.support.webhook_receiver import Receiver, running_receiver

pytestmark = pytest.mark.postgres
runner = CliRunner()
#: caps 0.2 s, 0.6 s: three attempts take about a second
BUDGET = {"max_attempts": 3, "base_delay_s": 0.2, "multiplier": 3, "max_delay_s": 5}


@pytest.fixture
def env(tmp_path: Path, pg_url: str) -> Iterator[tuple[AppContext, Any]]:
    ctx = make_context(tmp_path / "data", pg_url, client_webhooks={"allow_private_networks": True})
    tenant_with_key(ctx, "alice", credits=100)
    sets = ["--set", f"database.url={pg_url}", "--set", f"data_dir={tmp_path / 'data'}"]
    budget = [a for k, v in BUDGET.items() for a in ("--set", f"retry.notification.{k}={v}")]
    private = ["--set", "client_webhooks.allow_private_networks=true"]
    # the engine delivering the webhooks is its own process, as `aivedio serve` runs in production
    log = (tmp_path / "serve.log").open("wb")
    engine = subprocess.Popen(
        [sys.executable, "-m", "aivedio_cli", *sets, *budget, *private, "serve", "--role", "relay,worker"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")},
    )

    def cli(*args: str, private: bool = True) -> Any:
        return runner.invoke(app, [*sets, *(private_sets if private else []), *args], env={"COLUMNS": "250"})

    private_sets = private
    try:
        yield ctx, cli
    finally:
        engine.send_signal(signal.SIGTERM)
        try:
            engine.wait(30)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait(10)
        log.close()
        ctx.close()


def ok_json(result: Any) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def cancel_one(ctx: AppContext, key: str) -> uuid.UUID:
    tenant = next(t for t in ctx.tenants.list() if t.name == "alice")
    task = ctx.generations.create(tenant.id, key, {"prompt": "x", "model": "local-v1", "duration_s": 2}).task
    ctx.generations.cancel(tenant.id, task.id)
    return task.id


def states(cli: Any, endpoint_id: str) -> list[dict[str, Any]]:
    return list(ok_json(cli("webhooks", "deliveries", "--endpoint", endpoint_id, "--json"))["data"])


def test_add_list_rotate_remove(env: tuple[AppContext, Any]) -> None:
    ctx, cli = env
    added = ok_json(cli("webhooks", "add", "--tenant", "alice", "--url", "https://hooks.example.com/x", "--json"))
    assert set(added) == {"id", "secret"} and added["secret"].startswith("whsec_")

    listed = ok_json(cli("webhooks", "list", "--tenant", "alice", "--json"))["data"]
    assert [e["id"] for e in listed] == [added["id"]] and listed[0]["events"] == ["*"]
    assert added["secret"] not in json.dumps(listed), "a secret is shown once"

    rotated = ok_json(cli("webhooks", "rotate", added["id"], "--json"))
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != added["secret"]
    assert rotated["previous_secret_until"] is not None

    no_tty = cli("webhooks", "remove", added["id"])
    assert no_tty.exit_code == 4 and "--yes" in no_tty.output
    assert ok_json(cli("webhooks", "remove", added["id"], "--yes", "--json"))["removed"] is True
    assert ok_json(cli("webhooks", "list", "--json"))["data"] == []
    again = cli("webhooks", "remove", added["id"], "--yes")
    assert again.exit_code == 5 and "not found" in again.output
    with ctx.engine.connect() as conn:
        audits = conn.execute(
            sa.select(audit_log).where(audit_log.c.command.like("webhooks %")).order_by(audit_log.c.created_at)
        ).all()
    assert [(a.command, a.outcome) for a in audits] == [
        ("webhooks add", "created"),
        ("webhooks rotate", "rotated"),
        ("webhooks remove", "removed"),
    ]
    assert all(added["id"] in a.affected_ids for a in audits)
    assert "whsec_" not in json.dumps([a.args for a in audits]), "secrets never reach the audit log"


def test_bad_input_is_one_line_and_nonzero(env: tuple[AppContext, Any]) -> None:
    _, cli = env
    refused = cli("webhooks", "add", "--tenant", "alice", "--url", "http://127.0.0.1:9/x", private=False)
    assert refused.exit_code == 2
    assert "blocked address" in refused.output and "allow_private_networks" in refused.output
    bad_event = cli("webhooks", "add", "--tenant", "alice", "--url", "https://a.example/x", "--events", "DONE")
    assert bad_event.exit_code == 2 and "unknown event 'DONE' (known: *, CREATED" in bad_event.output
    no_tenant = cli("webhooks", "add", "--tenant", "bob", "--url", "https://a.example/x")
    assert no_tenant.exit_code == 5 and "tenant 'bob' not found" in no_tenant.output
    bad_scheme = cli("webhooks", "add", "--tenant", "alice", "--url", "ftp://a.example/x")
    assert bad_scheme.exit_code == 2 and "scheme" in bad_scheme.output
    bad_state = cli("webhooks", "deliveries", "--state", "LOST")
    assert bad_state.exit_code == 2 and "known: PENDING, DELIVERED, FAILED, DEAD" in bad_state.output


def test_dead_after_the_budget_then_replay_delivers(env: tuple[AppContext, Any]) -> None:
    ctx, cli = env
    rx: Receiver
    with running_receiver(script=[500]) as rx:
        added = ok_json(cli("webhooks", "add", "--tenant", "alice", "--url", rx.url, "--events", "CANCELED", "--json"))
        rx.secrets.append(added["secret"])
        cancel_one(ctx, "k1")
        wait_until(lambda: [d["state"] for d in states(cli, added["id"])] == ["DEAD"], timeout_s=30, what="DEAD")
        (dead,) = states(cli, added["id"])
        assert (dead["attempts"], dead["last_status_code"], dead["status"]) == (3, 500, "CANCELED")
        assert rx.count() == 3 and all(r.verified_by for r in rx.received)
        human = cli("webhooks", "deliveries", "--state", "DEAD")
        assert human.exit_code == 0 and dead["id"] in human.stdout and "HTTP 500" in human.stdout

        preview = ok_json(cli("replay", "webhooks", "--dry-run", "--json"))
        assert preview["total"] == 1 and preview["result"]["done"] == [{"id": dead["id"]}]
        assert [d["state"] for d in states(cli, added["id"])] == ["DEAD"], "a dry run changes nothing"
        no_reason = cli("replay", "webhooks", "--yes")
        assert no_reason.exit_code == 2 and "--reason" in no_reason.output
        no_tty = cli("replay", "webhooks", "--reason", "receiver fixed")
        assert no_tty.exit_code == 4 and "--yes" in no_tty.output

        rx.script = [200]  # the receiver is fixed
        done = ok_json(cli("replay", "webhooks", "--reason", "receiver fixed", "--yes", "--json"))
        assert done["result"]["done"] == [{"id": dead["id"]}]
        wait_until(lambda: states(cli, added["id"])[0]["state"] == "DELIVERED", timeout_s=30, what="DELIVERED")
    (delivered,) = states(cli, added["id"])
    assert (delivered["attempts"], delivered["last_status_code"]) == (1, 200), "a replay gets a fresh budget"
    assert rx.count() == 4 and rx.received[-1].answered == 200 and rx.received[-1].verified_by
    assert len({r.headers["webhook-id"] for r in rx.received}) == 1, "the replay keeps the message id"
    with ctx.engine.connect() as conn:
        audits = conn.execute(sa.select(audit_log).where(audit_log.c.command == "replay webhooks")).all()
    assert [(a.dry_run, a.outcome, a.reason) for a in audits] == [
        (True, "would_replay", None),
        (False, "replayed", "receiver fixed"),
    ]
    assert ok_json(cli("replay", "webhooks", "--reason", "again", "--yes", "--json"))["total"] == 0
