"""Event types carried by the outbox, and the actor + queue each one is delivered to.

The relay publishes every outbox row to the actor named in its `target` (by default `ROUTES[event_type]`); one
table keeps names from drifting between the writer (services) and the consumers (worker actors).

Output fetches have a second, urgent route: a fetch whose URL expires soon goes to its own queue, drained by
its own consumer and ahead of the ordinary fetches a worker holds (lower Dramatiq priority number), so a backlog
of fresh URLs never makes an expiring one wait (fetch before the provider's URL expires).

System B steps have one broker queue per step queue, named as the seed names them: a step that
becomes due is announced by a `workflow.step.due` row routed to its queue's actor (`run_step_<queue>`), so a
worker given only some queues consumes only those, and an idle queue is a consumer blocked on its broker. The
message is only a wake-up: the consumer claims the best due step of its queue from the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from aivedio_engine.domain.workflow import QueueName as StepQueue


class EventType(StrEnum):
    GENERATION_QUEUED = "generation.queued"
    PROVIDER_SUBMIT_REQUESTED = "provider.submit.requested"
    PROVIDER_STATUS_OBSERVED = "provider.status.observed"
    #: stop a vendor job nobody will use: a duplicate made for an attempt closed as never created (`late_jobs`)
    PROVIDER_CANCEL_REQUESTED = "provider.cancel.requested"
    FETCH_REQUESTED = "fetch.requested"
    MEDIA_PROCESS_REQUESTED = "media.process.requested"
    TASK_STATUS_CHANGED = "task.status.changed"
    WEBHOOK_DELIVERY_REQUESTED = "webhook.delivery.requested"
    #: a System B step is due on its queue (the wake-up of that queue's consumer; the step row is the truth)
    STEP_DUE = "workflow.step.due"


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
    #: client webhooks: their own queue, so a deployment can give slow client endpoints their own workers
    WEBHOOKS = "webhooks"


@dataclass(frozen=True, slots=True)
class Route:
    actor: str
    queue: Queue | StepQueue
    #: Dramatiq actor priority: among the messages a worker holds, lower numbers run first
    priority: int = 10


#: Dramatiq priority of each step queue's actor among the messages one worker holds (lower runs first): the face
#: check decides whether generation may go on, the costly real-video and lip-sync work and cleanup yield
_STEP_ACTOR_PRIORITY = {
    StepQueue.FACE_CONSISTENCY: 0,
    StepQueue.REAL_VIDEO_CLIP: 20,
    StepQueue.LIPSYNC: 20,
    StepQueue.CLEANUP: 30,
}
#: one route per System B step queue
STEP_ROUTES: dict[StepQueue, Route] = {
    q: Route(f"run_step_{q.value}", q, _STEP_ACTOR_PRIORITY.get(q, 10)) for q in StepQueue
}

ROUTES: dict[EventType, Route] = {
    EventType.GENERATION_QUEUED: Route("on_generation_queued", Queue.DISPATCH),
    EventType.PROVIDER_SUBMIT_REQUESTED: Route("submit_to_provider", Queue.PROVIDER_IO),
    EventType.PROVIDER_STATUS_OBSERVED: Route("reduce_provider_status", Queue.STATE),
    EventType.PROVIDER_CANCEL_REQUESTED: Route("cancel_provider_job", Queue.PROVIDER_IO),
    EventType.FETCH_REQUESTED: Route("fetch_output", Queue.FETCH),
    EventType.MEDIA_PROCESS_REQUESTED: Route("process_media", Queue.MEDIA),
    EventType.TASK_STATUS_CHANGED: Route("notify_status_changed", Queue.NOTIFY),
    EventType.WEBHOOK_DELIVERY_REQUESTED: Route("deliver_webhook", Queue.WEBHOOKS),
    # the default of the step routes; a step's row is written to its own queue's route (`STEP_ROUTES`)
    EventType.STEP_DUE: STEP_ROUTES[StepQueue.PHOTO_CHECK],
}

URGENT_FETCH = Route("fetch_output_urgent", Queue.FETCH_URGENT, priority=0)
#: many `provider.status.observed` events in one message: the relay groups up to `broker.reducer_batch` of one
#: claim, and they are reduced in one transaction. Not an outbox target: every row still names the one-event actor
REDUCE_BATCH = Route("reduce_provider_statuses", Queue.STATE)


#: the SSE wake-up of a status change (`notify.py`): a copy of each `task.status.changed` the relay publishes
#: besides the row's own message. Best effort, so never an outbox target: a lost signal costs latency, since
#: the streams re-read the state events on their heartbeat and after a resubscribe
STATUS_SIGNAL = Route("signal_status_changed", Queue.NOTIFY)
#: outbox target → the other consumers the relay publishes each of its rows to, each as a message of its own
#: (its own retries, dead letter and inbox group): one row, and the writer's transaction, serve them all
ALSO_PUBLISHED_TO: dict[str, tuple[Route, ...]] = {ROUTES[EventType.TASK_STATUS_CHANGED].actor: (STATUS_SIGNAL,)}
#: the actors that tell clients about their tasks: a dead letter of one of them raises an alert
NOTIFICATION_ACTORS = frozenset(
    {
        ROUTES[EventType.TASK_STATUS_CHANGED].actor,
        STATUS_SIGNAL.actor,
        ROUTES[EventType.WEBHOOK_DELIVERY_REQUESTED].actor,
    }
)

#: routes besides the default one that an event type may be written to
ALTERNATE_ROUTES: dict[EventType, tuple[Route, ...]] = {
    EventType.FETCH_REQUESTED: (URGENT_FETCH,),
    EventType.STEP_DUE: tuple(r for q, r in STEP_ROUTES.items() if q is not StepQueue.PHOTO_CHECK),
}
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
