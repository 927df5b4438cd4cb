"""Follow-on payloads: each event type's payload is built and parsed by one class, so writers and consumers agree."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from aivedio_engine.domain.events import EventType
from aivedio_engine.services.follow_on import FetchRequested, MediaProcessRequested, StepTries, SubmitRequested

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_every_payload_round_trips_through_its_parser() -> None:
    task, attempt, asset = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    tries = StepTries(3, T0, T0)
    messages = [
        SubmitRequested(attempt, task),
        SubmitRequested(attempt, task, resent=True),
        FetchRequested(task, attempt, "sim", "job-1", ({"url": "https://x.test/a", "index": 0},), tries, True),
        MediaProcessRequested(task, asset, tries),
    ]
    for message in messages:
        assert type(message).parse(message.payload()) == message


def test_payloads_keep_the_fields_consumers_and_operators_read() -> None:
    task, attempt = uuid.uuid4(), uuid.uuid4()
    assert SubmitRequested(attempt, task).payload() == {"attempt_id": str(attempt), "task_id": str(task)}
    fetch = FetchRequested(task, attempt, "sim", None)
    assert fetch.payload() == {
        "task_id": str(task),
        "attempt_id": str(attempt),
        "provider": "sim",
        "job_id": None,
        "outputs": [],
    }
    assert (fetch.event_type, fetch.aggregate_type, fetch.aggregate_id) == (EventType.FETCH_REQUESTED, "task", task)
    submit = SubmitRequested(attempt, task)
    assert (submit.event_type, submit.aggregate_type, submit.aggregate_id) == (
        EventType.PROVIDER_SUBMIT_REQUESTED,
        "attempt",
        attempt,
    )


def test_a_retried_step_carries_its_try_count_and_first_failure() -> None:
    p = MediaProcessRequested(uuid.uuid4(), uuid.uuid4(), StepTries(2, T0, T0)).payload()
    assert (p["try"], p["first_failure_at"], p["step_started_at"]) == (2, T0.isoformat(), T0.isoformat())
    assert "try" not in MediaProcessRequested(uuid.uuid4(), uuid.uuid4()).payload()  # a first try carries none
