"""Provider status observations as the reducer receives them, and outbox rows as the relay claims them, for tests of
the reducer's and the relay's paths."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from aivedio_engine.clock import new_id
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.domain.status import EventSource
from aivedio_engine.providers.base import JobStatus, Observation, Output
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.observations import to_payload


def status_envelope(attempt: Any, status: JobStatus, at_s: int, now: object) -> Envelope:
    """A callback's `provider.status.observed` envelope for the attempt's job, `at_s` seconds after its submit."""
    outputs = (Output(url="https://cdn.example/out.mp4"),) if status is JobStatus.SUCCEEDED else ()
    obs = Observation(
        job_id=attempt.provider_job_id,
        status=status,
        outputs=outputs,
        provider_updated_at=attempt.submitted_at + timedelta(seconds=at_s),
        event_id=f"{attempt.provider_job_id}:{status.value}",
    )
    event_id = new_id()
    payload = to_payload(attempt.provider, obs, EventSource.CALLBACK, f"wh:{obs.event_id}", event_id)
    return Envelope(
        event_id=event_id,
        event_type=EventType.PROVIDER_STATUS_OBSERVED.value,
        schema_version=1,
        aggregate_id=attempt.task_id,
        aggregate_version=0,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        occurred_at=now,  # type: ignore[arg-type]
        payload=payload,
    )


def outbox_row(
    event_type: EventType = EventType.PROVIDER_STATUS_OBSERVED,
    *,
    target: str | None = None,
    payload: dict[str, Any] | None = None,
    created_at: datetime | None = None,
) -> Any:
    """A claimed outbox row (the fields `worker.relay.messages` reads), due to its event type's default actor."""
    return SimpleNamespace(
        id=uuid.uuid4(),
        event_type=event_type.value,
        schema_version=1,
        aggregate_id=uuid.uuid4(),
        aggregate_version=1,
        tenant_id=None,
        trace_id=None,
        causation_id=None,
        created_at=created_at or datetime(2026, 12, 7, tzinfo=UTC),
        payload=payload if payload is not None else {},
        target=target or ROUTES[event_type].actor,
    )
