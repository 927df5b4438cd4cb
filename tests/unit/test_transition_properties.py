"""Hypothesis properties of decide() over random event sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.domain.transitions import (
    TASK_MACHINE,
    Decision,
    Rejection,
    TaskEvent,
    TaskSnapshot,
    Trigger,
    decide,
)

START = datetime(2026, 1, 1, tzinfo=UTC)


def _walk(data: st.DataObject, steps: int) -> list[tuple[TaskSnapshot, Trigger, Decision | Rejection]]:
    """Half the time an arbitrary event, half the time one the table allows: deep states get visited."""
    task = TaskSnapshot(TaskStatus.CREATED, deadline_at=START + timedelta(seconds=data.draw(st.integers(0, 3600))))
    now = START
    trace = []
    for _ in range(steps):
        now += timedelta(seconds=data.draw(st.integers(0, 120)))
        allowed = [e.event for e in TASK_MACHINE.edges() if e.source is task.status]
        if allowed and data.draw(st.booleans()):
            event = data.draw(st.sampled_from(allowed))
        else:
            event = data.draw(st.sampled_from(list(TaskEvent)))
        stale = data.draw(st.booleans()) and data.draw(st.booleans())
        trigger = Trigger(
            event,
            expected_version=task.version - 1 if stale else data.draw(st.one_of(st.none(), st.just(task.version))),
            progress=data.draw(st.one_of(st.none(), st.integers(-10, 150))),
        )
        result = decide(task, trigger, now)
        trace.append((task, trigger, result))
        if isinstance(result, Decision):
            task = TaskSnapshot(result.to_status, result.version, result.progress, task.deadline_at)
    return trace


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_sequences_keep_every_invariant(data: st.DataObject) -> None:
    trace = _walk(data, data.draw(st.integers(1, 50)))
    visited = [TaskStatus.CREATED]
    for before, trigger, result in trace:
        if before.status in TASK_TERMINAL:
            # a terminal state is never left
            assert isinstance(result, Rejection)
        if isinstance(result, Decision):
            assert result.from_status is before.status
            assert result.version == before.version + 1  # exactly +1 per applied transition
            assert result.progress >= before.progress  # progress never decreases
            assert 0 <= result.progress <= 100
            if before.status is TaskStatus.CREATED:
                assert result.to_status is not TaskStatus.SUCCEEDED
            if trigger.expected_version is not None:
                assert trigger.expected_version == before.version
            visited.append(result.to_status)
        else:
            assert result.status is before.status
    if TaskStatus.SUCCEEDED in visited:
        upto = visited[: visited.index(TaskStatus.SUCCEEDED)]
        assert TaskStatus.OUTPUT_FETCHING in upto and TaskStatus.POST_PROCESSING in upto
    assert all(s not in TASK_TERMINAL for s in visited[:-1])  # nothing after a terminal state


def test_the_walk_reaches_success_through_the_happy_path() -> None:
    """Guards the property test: SUCCEEDED must be reachable, or the success property would be vacuous."""
    task = TaskSnapshot(TaskStatus.CREATED)
    path = [
        TaskEvent.VALIDATION_STARTED,
        TaskEvent.VALIDATION_PASSED,
        TaskEvent.QUEUED,
        TaskEvent.DISPATCH_CLAIMED,
        TaskEvent.PROVIDER_ACCEPTED,
        TaskEvent.PROVIDER_SUCCEEDED,
        TaskEvent.OUTPUT_PERSISTED,
        TaskEvent.PLAYABLE_ASSET_READY,
    ]
    for event in path:
        result = decide(task, event, START)
        assert isinstance(result, Decision), result
        task = TaskSnapshot(result.to_status, result.version, result.progress)
    assert task.status is TaskStatus.SUCCEEDED and task.version == len(path) and task.progress == 100
