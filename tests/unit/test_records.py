"""The task and attempt records are built positionally from rows of every column: their fields must be the
tables' columns, in table order, or every record would silently carry the wrong values."""

from __future__ import annotations

from dataclasses import fields

import pytest

from aivedio_engine.db.records import Attempt, OutboxRow, ReviewItem, ReviewRow, Task
from aivedio_engine.db.tables import generation_tasks, outbox_events, review_items, task_attempts


@pytest.mark.parametrize(
    ("record", "table"),
    [(Task, generation_tasks), (Attempt, task_attempts), (ReviewItem, review_items), (OutboxRow, outbox_events)],
)
def test_record_fields_are_the_columns_in_table_order(record: type, table: object) -> None:
    assert [f.name for f in fields(record)] == [c.name for c in table.c]  # type: ignore[attr-defined]


def test_of_keeps_none_and_reads_a_row_positionally() -> None:
    assert Task.of(None) is None and Attempt.of(None) is None
    values = [f"v{i}" for i in range(len(fields(Attempt)))]
    attempt = Attempt.of(values)
    assert attempt is not None and attempt.id == "v0" and attempt.vendor_refunded == values[-1]


def test_a_review_row_is_the_item_then_its_subject() -> None:
    assert [f.name for f in fields(ReviewRow)] == [c.name for c in review_items.c] + [
        "task_status",
        "project_id",
        "step_key",
    ]
