"""The reducer benchmark's pure parts: the event stream it delivers and the round-trip counter's trace parser.

Nothing here times anything or needs a database."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bench.reducer import RUNNING, SUCCEEDED, build_stream, parse_trace, sql_label, stream_stats


@pytest.mark.parametrize(("n_tasks", "lag"), [(1, 1000), (7, 3), (500, 100), (2000, 1000)])
def test_every_task_gets_one_running_then_one_succeeded_at_least_lag_apart(n_tasks: int, lag: int) -> None:
    items = build_stream(n_tasks, lag=lag, dup_fraction=0.05, rng=random.Random(1))
    originals = [(i, it) for i, it in enumerate(items) if not it.dup]
    assert Counter((it.task, it.phase) for _, it in originals) == {
        (t, p): 1 for t in range(n_tasks) for p in (RUNNING, SUCCEEDED)
    }
    pos = {(it.task, it.phase): i for i, it in originals}
    gaps = [pos[(t, SUCCEEDED)] - pos[(t, RUNNING)] for t in range(n_tasks)]
    assert min(gaps) >= min(lag, n_tasks)
    assert stream_stats(items)["min_running_to_succeeded"] == min(gaps)


def test_duplicates_are_five_percent_later_redeliveries_and_never_the_last_delivery() -> None:
    items = build_stream(1000, lag=200, dup_fraction=0.05, rng=random.Random(7))
    stats = stream_stats(items)
    assert stats == {
        "deliveries": 2100,
        "distinct": 2000,
        "duplicates": 100,
        "tasks": 1000,
        "min_running_to_succeeded": stats["min_running_to_succeeded"],
    }
    first = {}
    for i, it in enumerate(items):
        key = (it.task, it.phase)
        if it.dup:
            assert key in first, "a re-delivery must follow its original"
        else:
            first[key] = i
    assert not items[-1].dup


def test_stream_is_reproducible_from_the_seed_and_handles_no_duplicates() -> None:
    a = build_stream(300, lag=50, dup_fraction=0.05, rng=random.Random(3))
    assert a == build_stream(300, lag=50, dup_fraction=0.05, rng=random.Random(3))
    plain = build_stream(300, lag=50, dup_fraction=0.0, rng=random.Random(3))
    assert len(plain) == 600 and not any(it.dup for it in plain)
    assert build_stream(0, lag=10, dup_fraction=0.05, rng=random.Random(3)) == []


TRACE = """F\t10\tQuery\t "BEGIN"
B\t10\tCommandComplete\t "BEGIN"
B\t5\tReadyForQuery\t T
F\t60\tParse\t "_pg3_0" "SELECT task_attempts.id
FROM task_attempts
WHERE task_attempts.provider = $1" 2 NNNN NNNN
F\t22\tBind\t "" "_pg3_0" 0 2 4 'sim' 3 'j-1' 1 0
F\t6\tDescribe\t P ""
F\t9\tExecute\t "" 0
F\t4\tSync
B\t4\tParseComplete
B\t5\tReadyForQuery\t T
F\t22\tBind\t "" "_pg3_0" 0 2 4 'sim' 3 'j-2' 1 0
F\t9\tExecute\t "" 0
F\t4\tSync
B\t5\tReadyForQuery\t T
F\t11\tQuery\t "COMMIT"
B\t5\tReadyForQuery\t I
"""


def test_trace_parser_counts_one_round_trip_per_ready_for_query_and_labels_prepared_statements() -> None:
    prepared: dict[str, str] = {}
    cycles = parse_trace(TRACE.splitlines(), prepared)
    assert len(cycles) == 4
    assert [sql_label(c) for c in cycles] == ["BEGIN", "SELECT task_attempts", "SELECT task_attempts", "COMMIT"]
    assert "_pg3_0" in prepared


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        (
            "INSERT INTO inbox_dedup (a) VALUES ($1) ON CONFLICT (a) DO NOTHING RETURNING a",
            "INSERT inbox_dedup ON CONFLICT",
        ),
        ("SELECT g.id FROM generation_tasks AS g WHERE g.id = $1 FOR UPDATE", "SELECT generation_tasks FOR UPDATE"),
        ("UPDATE task_attempts SET x=$1", "UPDATE task_attempts"),
        ("SELECT pg_notify($1, '')", "SELECT pg_notify"),
        (";", "pre-ping (empty query)"),
        ("ROLLBACK", "ROLLBACK"),
    ],
)
def test_sql_label(sql: str, label: str) -> None:
    assert sql_label(sql) == label


def test_a_warm_up_slice_goes_in_two_phases_every_running_before_any_succeeded() -> None:
    """A short slice sent in one go would let a batch of SUCCEEDED overtake its RUNNING (then stale)."""
    from bench.reducer import Slice, phases

    items = build_stream(40, lag=1000, dup_fraction=0.1, rng=random.Random(3))
    envelopes = [(it.task, it.phase, it.dup) for it in items]  # stand-ins: phases only passes them through
    sl = Slice("warm", [], items, envelopes, stream_stats(items))
    (first, n_first), (second, n_second) = phases(sl)
    assert {phase for _, phase, _ in first} == {RUNNING} and {phase for _, phase, _ in second} == {SUCCEEDED}
    assert len(first) + len(second) == len(items)
    assert (n_first, n_second) == (40, 40)  # distinct events: a re-delivery is not counted
    assert n_first + n_second == sl.distinct


def test_a_batch_round_trip_sequence_is_written_with_its_per_event_writes_once() -> None:
    from bench.reducer import collapse

    assert collapse(["claim", "a", "b", "a", "b", "a", "b", "commit"]) == ["claim", "(a, b) ×3", "commit"]
    assert collapse(["claim", "a", "b", "c", "commit"]) == ["claim", "a", "b", "c", "commit"]
    assert collapse(["claim", "commit"]) == ["claim", "commit"]
