"""Chaos at full scale in CI: `bench/run chaos --tasks 60` through real processes (bench/chaos/__init__.py).

Six role processes, the sim with its faults, SIGKILLs of every role, Redis flushes, broker connection kills and
database backend terminations while an independent client submits 60 tasks; every check of the run (quiescence,
`aivedio audit`, the sim's truth, the ledger, slots, the client's history) must report no violation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chaos import run_chaos

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(420)]


def test_sixty_tasks_under_chaos_leave_no_violation(tmp_path: Path, pg_url: str) -> None:
    # pg_url: skips (or fails under CI) when PostgreSQL is down; the run makes and drops a database of its own
    report = run_chaos(60, seed=7, workdir=tmp_path / "run", fault_gap_s=1.5, spread_s=20, quiesce_budget_s=300)
    doc = json.dumps(report.to_json(), indent=1, default=str)
    kills = sum(v for k, v in report.faults.items() if k.startswith("kill:"))
    assert kills >= 3 and report.figures["client"].get("create:ok", 0) >= 60, doc
    assert report.ok, doc
