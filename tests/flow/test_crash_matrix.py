"""The crash-point matrix (issue 14 item 6, tests/support/crash_matrix.py): every step's commit boundary, a death
before and after the commit, then a fresh engine drives every task to its end with the books and the audit clean.

CI runs every cell with 2 tasks. The full matrix is the same module with more tasks per cell:

    CRASH_MATRIX_TASKS=20 .venv/bin/python -m pytest tests/flow/test_crash_matrix.py -p no:randomly -q
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.crash_matrix import STEPS, points, run_cell

TASKS = int(os.environ.get("CRASH_MATRIX_TASKS", "2"))
#: one JSON line per cell is appended here when set (the figures of a full run)
REPORT = os.environ.get("CRASH_MATRIX_REPORT")


def test_the_matrix_covers_at_least_fourteen_steps_before_and_after() -> None:
    assert len(STEPS) >= 14 and len(list(points())) == 2 * len(STEPS)


@pytest.mark.parametrize("point", list(points()))
def test_one_death_at_a_commit_boundary_leaves_every_task_finished_and_the_books_clean(
    tmp_path: Path, pg_url: str, point: str
) -> None:
    result = run_cell(tmp_path, pg_url, point, TASKS)
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps({**vars(result), "ok": result.ok}) + "\n")
    assert result.ok, result
