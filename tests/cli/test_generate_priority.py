"""`aivedio generate --priority T`: the tier the task asks for, capped by the tenant's (embedded mode)."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.config import load_settings
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import generation_tasks

runner = CliRunner()


def _priorities(data: Path) -> dict[str, int]:
    engine = make_engine(load_settings(None, {"data_dir": str(data)}))
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(generation_tasks.c.client_idempotency_key, generation_tasks.c.priority))
            return {k: p for k, p in rows}
    finally:
        engine.dispose()


def test_generate_priority_is_sent_and_capped_by_the_tenant_tier(tmp_path: Path) -> None:
    def generate(key: str, *extra: str) -> None:
        args = ["--set", f"data_dir={tmp_path}", "generate", "a lake", "--duration", "1", "--json"]
        r = runner.invoke(app, [*args, "--idempotency-key", key, *extra])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["status"] not in ("FAILED_FINAL",)

    generate("worse", "--priority", "4")
    generate("better", "--priority", "1")  # the embedded `local` tenant is tier 2 (paid)
    generate("none")
    assert _priorities(tmp_path) == {"worse": 4, "better": 2, "none": 2}
    bad = runner.invoke(app, ["--set", f"data_dir={tmp_path}", "generate", "a lake", "--priority", "9"])
    assert bad.exit_code == 2
