"""Running the real root command in a test: `Cli` points it at the test's database and clock as an operator, and
`status_of` / `audit_rows` read what a command left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from aivedio_cli import _services
from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.db.tables import audit_log, generation_tasks

OPERATOR = "oncall@example.test"


class Cli:
    """The real root command, pointed at the test's database with `--set` (and a config file when given). It
    shares the test's engine clock, so "older than" and "60 s after the send" mean the same on both sides."""

    def __init__(self, ctx: AppContext, monkeypatch: pytest.MonkeyPatch, config: Path | None = None) -> None:
        monkeypatch.setattr(_services, "build_context", lambda settings: build_context(settings, clock=ctx.clock))
        monkeypatch.setenv("AIVEDIO_OPERATOR", OPERATOR)
        self.args = [
            *(["--config", str(config)] if config else []),
            "--set",
            f"data_dir={ctx.settings.data_dir}",
            "--set",
            f"database.url={ctx.settings.database.url}",
        ]

    def __call__(self, *args: str) -> Result:
        return CliRunner().invoke(app, [*self.args, *args])

    def json(self, *args: str, code: int = 0) -> Any:
        result = self(*args, "--json")
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        return json.loads(result.stdout)

    def fails(self, code: int, *args: str) -> str:
        """Run, expect exit `code` with exactly one `error:` line on stderr; returns that line."""
        result = self(*args)
        assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        return lines[0]


def status_of(ctx: AppContext, task_id: Any) -> str:
    with ctx.engine.connect() as conn:
        return str(
            conn.execute(sa.select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)).scalar_one()
        )


def audit_rows(ctx: AppContext, command: str) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(audit_log)
                .where(audit_log.c.command == command)
                .order_by(audit_log.c.created_at, audit_log.c.id)
            )
        )
