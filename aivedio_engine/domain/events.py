"""Event types carried by the outbox, and the actor + queue each one is delivered to.

The relay publishes every outbox row to `ROUTES[event_type]`; one table keeps names from drifting between the
writer (services) and the consumers (worker actors).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EventType(StrEnum):
    GENERATION_QUEUED = "generation.queued"
    PROVIDER_SUBMIT_REQUESTED = "provider.submit.requested"
    PROVIDER_STATUS_OBSERVED = "provider.status.observed"
    FETCH_REQUESTED = "fetch.requested"
    MEDIA_PROCESS_REQUESTED = "media.process.requested"
    TASK_STATUS_CHANGED = "task.status.changed"
    ASSET_VALIDATION_REQUESTED = "asset.validation.requested"


class Queue(StrEnum):
    DISPATCH = "dispatch"
    PROVIDER_IO = "provider_io"
    STATE = "state"
    FETCH = "fetch"
    MEDIA = "media"
    NOTIFY = "notify"
    BILLING = "billing"
    MAINTENANCE = "maintenance"


@dataclass(frozen=True, slots=True)
class Route:
    actor: str
    queue: Queue


ROUTES: dict[EventType, Route] = {
    EventType.GENERATION_QUEUED: Route("on_generation_queued", Queue.DISPATCH),
    EventType.PROVIDER_SUBMIT_REQUESTED: Route("submit_to_provider", Queue.PROVIDER_IO),
    EventType.PROVIDER_STATUS_OBSERVED: Route("reduce_provider_status", Queue.STATE),
    EventType.FETCH_REQUESTED: Route("fetch_output", Queue.FETCH),
    EventType.MEDIA_PROCESS_REQUESTED: Route("process_media", Queue.MEDIA),
    EventType.TASK_STATUS_CHANGED: Route("notify_status_changed", Queue.NOTIFY),
    EventType.ASSET_VALIDATION_REQUESTED: Route("validate_asset", Queue.MEDIA),
}
