"""`aivedio replay observations`: the stored provider observations whose message was lost are listed (exact count)
and, with a reason, reduced again now, through the real root command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.db.tables import audit_log, generation_tasks, task_attempts
from aivedio_engine.providers.base import JobStatus
from tests.flow.test_keep_moving import _lose_observed_messages, _rows, _store, _submitted
from tests.support.sim import running_sim

runner = CliRunner()


def cli(url: str, data_dir: Path, *args: str) -> Any:
    return runner.invoke(
        app, ["--set", f"database.url={url}", "--set", f"data_dir={data_dir}", *args], env={"COLUMNS": "250"}
    )


def test_replay_observations_lists_then_reduces_the_lost_ones(tmp_path: Path, pg_url: str) -> None:
    with running_sim(seed=45, job_seconds=3000) as sim:
        ctx = _submitted(tmp_path, sim, pg_url, 2)
        data = tmp_path / "data"
        lost, other = _rows(ctx, task_attempts)
        _store(ctx, lost, JobStatus.SUCCEEDED, "evt-lost")
        _store(ctx, other, JobStatus.RUNNING, "evt-other")
        assert _lose_observed_messages(ctx) == 2

        dry = cli(pg_url, data, "replay", "observations", "--task", str(lost.task_id), "--dry-run", "--json")
        assert dry.exit_code == 0, dry.stdout + dry.stderr
        preview = json.loads(dry.stdout)
        assert (preview["total"], preview["result"]["outcome"]) == (1, "dry_run")
        assert [(i["task_id"], i["status"]) for i in preview["items"]] == [(str(lost.task_id), "succeeded")]

        refused = cli(pg_url, data, "replay", "observations", "--yes")
        assert refused.exit_code == 2 and "--reason" in refused.stderr
        assert cli(pg_url, data, "replay", "observations", "--task", "nope", "--dry-run").exit_code == 2

        done = cli(pg_url, data, "replay", "observations", "--reason", "redis flushed", "--yes", "--json")
        assert done.exit_code == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)["result"]
        assert result["outcome"] == "rereduced"
        assert sorted(d["outcome"] for d in result["rereduced"]) == ["applied:OUTPUT_FETCHING", "applied:RUNNING"]
        assert {r.id: r.status for r in _rows(ctx, generation_tasks)} == {
            lost.task_id: "OUTPUT_FETCHING",
            other.task_id: "RUNNING",
        }

        again = json.loads(cli(pg_url, data, "replay", "observations", "--dry-run", "--json").stdout)
        assert again["total"] == 0  # classified now: nothing left to replay
        with ctx.engine.connect() as conn:
            logged = conn.execute(
                sa.select(audit_log.c.command, audit_log.c.dry_run).order_by(audit_log.c.created_at)
            ).all()
        assert ("replay observations", False) in [tuple(r) for r in logged]
        ctx.close()
