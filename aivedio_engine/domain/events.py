"""Event types carried by the outbox, and the actor + queue each one is delivered to.

The relay publishes every outbox row to the actor named in its `target` (by default `ROUTES[event_type]`); one
table keeps names from drifting between the writer (services) and the consumers (worker actors).

Output fetches have a second, urgent route: a fetch whose URL expires soon goes to its own queue, drained by
its own consumer and ahead of the ordinary fetches a worker holds (lower Dramatiq priority number), so a backlog
of fresh URLs never makes an expiring one wait (seed 000 §4.4: fetch before the provider's URL expires).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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
    FETCH_URGENT = "fetch_urgent"
    MEDIA = "media"
    NOTIFY = "notify"
    BILLING = "billing"
    MAINTENANCE = "maintenance"


@dataclass(frozen=True, slots=True)
class Route:
    actor: str
    queue: Queue
    #: Dramatiq actor priority: among the messages a worker holds, lower numbers run first
    priority: int = 10


ROUTES: dict[EventType, Route] = {
    EventType.GENERATION_QUEUED: Route("on_generation_queued", Queue.DISPATCH),
    EventType.PROVIDER_SUBMIT_REQUESTED: Route("submit_to_provider", Queue.PROVIDER_IO),
    EventType.PROVIDER_STATUS_OBSERVED: Route("reduce_provider_status", Queue.STATE),
    EventType.FETCH_REQUESTED: Route("fetch_output", Queue.FETCH),
    EventType.MEDIA_PROCESS_REQUESTED: Route("process_media", Queue.MEDIA),
    EventType.TASK_STATUS_CHANGED: Route("notify_status_changed", Queue.NOTIFY),
    EventType.ASSET_VALIDATION_REQUESTED: Route("validate_asset", Queue.MEDIA),
}

URGENT_FETCH = Route("fetch_output_urgent", Queue.FETCH_URGENT, priority=0)
#: routes besides the default one that an event type may be written to
ALTERNATE_ROUTES: dict[EventType, tuple[Route, ...]] = {EventType.FETCH_REQUESTED: (URGENT_FETCH,)}
#: actor name → its route (the relay publishes a row to its target's queue)
BY_ACTOR: dict[str, Route] = {
    r.actor: r for r in (*ROUTES.values(), *(a for alts in ALTERNATE_ROUTES.values() for a in alts))
}


def fetch_route(expires_at: list[datetime | None], now: datetime, urgent_within_s: float) -> Route:
    """The urgent fetch route when the first of the output URLs expires within `urgent_within_s`."""
    known = [e for e in expires_at if e is not None]
    if known and (min(known) - now).total_seconds() <= urgent_within_s:
        return URGENT_FETCH
    return ROUTES[EventType.FETCH_REQUESTED]
