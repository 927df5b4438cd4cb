"""The degradation harness in CI: `bench/run degrade --quick` on a few rows, each a fresh distributed system (every
role its own process, every dependency behind its own proxy), the dependency away for 8 s under load.

The full matrix (six rows, 30 s each) is a command; its options are in bench/README.md."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CI_ROWS = ("storage", "redis")


@pytest.mark.timeout(240)
def test_quick_rows_pass(tmp_path: Path) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl not found (the harness gives each row a private vhost)")
    out = tmp_path / "degrade.json"
    rows = [arg for name in CI_ROWS for arg in ("--row", name)]
    run = subprocess.run(
        [sys.executable, "-m", "bench", "degrade", "--quick", *rows, "--json", "--json-out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=230,
    )
    doc = json.loads(out.read_text())
    by_row = {r["row"]: r for r in doc["rows"]}
    assert set(by_row) == set(CI_ROWS), run.stderr[-2000:]
    for name, row in by_row.items():
        assert row["pass"], f"{name}: {row['failures']}\n{run.stderr[-2000:]}"
        assert row["recovery_s"] is not None and row["tasks"] > 0
    assert run.returncode == 0, run.stderr[-2000:]
