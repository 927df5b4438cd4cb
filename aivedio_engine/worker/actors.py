"""Thin actors: parse the envelope, call one service function. One entry per event type in `domain.events.ROUTES`,
plus one per route the relay also publishes an event type to (`domain.events.ALSO_PUBLISHED_TO`).

Actors are *declared* by `declare_actors(broker, ctx)` rather than decorated at import time: importing this module
never touches `dramatiq.get_broker()` (which would invent a localhost broker), each test can declare them on its
own StubBroker, and the process context reaches the service without a module-level global.

Adding a consumer for another event type is one function here:

    @consumes(EventType.FETCH_REQUESTED, max_retries=5, min_backoff=2_000, max_backoff=60_000, time_limit=30_000)
    def fetch_output(ctx: AppContext, envelope: Envelope) -> None:
        fetch.fetch_output(ctx.engine, ..., envelope, now=ctx.clock.now())

The actor's name and queue come from ROUTES, so the relay (which publishes by name) and the worker agree.
Retry options are always explicit: Dramatiq's defaults (20 retries, up to 7 days) are wrong for this product,
and a submit-to-provider actor must use max_retries=0 (its retries belong to the attempt logic).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dramatiq

from aivedio_engine.domain.events import ALTERNATE_ROUTES, REDUCE_BATCH, ROUTES, STATUS_SIGNAL, EventType, Route
from aivedio_engine.domain.workflow import STEP_SPECS, QueueName
from aivedio_engine.observability.logging import task_context
from aivedio_engine.observability.metrics import measure_actor
from aivedio_engine.services import intake, notifications, reducer, reducer_batch
from aivedio_engine.services.consume import Envelope, InvalidEnvelope
from aivedio_engine.services.follow_on import SubmitRequested
from aivedio_engine.worker.relay import message_of

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext

Handler = Callable[["AppContext", Envelope], None]
#: options every actor must state, so nobody inherits a default by accident
REQUIRED_OPTIONS = frozenset({"max_retries", "min_backoff", "max_backoff", "time_limit"})
#: errors that no retry can fix; the message goes straight to the dead letters
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (InvalidEnvelope,)


@dataclass(frozen=True)
class ActorSpec:
    event_type: EventType
    handler: Handler
    #: the actor's own route; the default route of an event type also serves its alternates (`ALTERNATE_ROUTES`)
    route: Route
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def routes(self) -> tuple[Route, ...]:
        if self.route != ROUTES[self.event_type]:
            return (self.route,)
        return (self.route, *ALTERNATE_ROUTES.get(self.event_type, ()))


#: actor name → how it consumes; filled by @consumes below. An event type may have several consumers: the one its
#: outbox rows name, and those the relay also publishes them to (`ALSO_PUBLISHED_TO`)
REGISTRY: dict[str, ActorSpec] = {}


def consumes(event_type: EventType, route: Route | None = None, **options: Any) -> Callable[[Handler], Handler]:
    """Register `handler(ctx, envelope)` as a consumer of `event_type` on `route` (by default the event type's
    own, `ROUTES`) with explicit Dramatiq options."""
    missing = REQUIRED_OPTIONS - options.keys()
    if missing:
        raise TypeError(f"actor for {event_type}: declare {', '.join(sorted(missing))} explicitly")
    own = route or ROUTES[event_type]

    def register(handler: Handler) -> Handler:
        if own.actor in REGISTRY:
            raise ValueError(f"{own.actor} is already declared: {REGISTRY[own.actor].handler.__name__}")
        REGISTRY[own.actor] = ActorSpec(event_type, handler, own, {"throws": PERMANENT_ERRORS, **options})
        return handler

    return register


def spec_for(actor: str) -> ActorSpec:
    """The consumer behind an actor name, alternate routes included; KeyError for a name this build lacks."""
    for spec in REGISTRY.values():
        if any(r.actor == actor for r in spec.routes):
            return spec
    raise KeyError(actor)


@consumes(EventType.GENERATION_QUEUED, max_retries=5, min_backoff=500, max_backoff=30_000, time_limit=30_000)
def on_generation_queued(ctx: AppContext, envelope: Envelope) -> None:
    # nothing writes generation.queued any more (the dispatcher scans QUEUED tasks itself); this drains rows an
    # older version left in the outbox, so they are consumed rather than going DEAD
    intake.mark_ready_for_dispatch(ctx.engine, envelope, now=ctx.clock.now())


@consumes(EventType.PROVIDER_SUBMIT_REQUESTED, max_retries=0, min_backoff=1_000, max_backoff=1_000, time_limit=120_000)
def submit_to_provider(ctx: AppContext, envelope: Envelope) -> None:
    # max_retries=0: a paid call is never repeated by the broker; the attempt logic owns submit retries, and a
    # duplicate delivery is harmless because only the NEW → SENDING winner calls the provider. The service frees
    # the slot of an attempt that ended, after its commit.
    ctx.submitter.submit(SubmitRequested.parse(envelope.payload).attempt_id)


@consumes(EventType.PROVIDER_STATUS_OBSERVED, max_retries=5, min_backoff=500, max_backoff=30_000, time_limit=30_000)
def reduce_provider_status(ctx: AppContext, envelope: Envelope) -> None:
    reducer.reduce_observation(
        ctx.engine, envelope, ctx.clock.now(), ctx.settings.fetch.urgent_within_s, slots=ctx.slots
    )


@consumes(EventType.PROVIDER_CANCEL_REQUESTED, max_retries=3, min_backoff=1_000, max_backoff=30_000, time_limit=60_000)
def cancel_provider_job(ctx: AppContext, envelope: Envelope) -> None:
    # broker retries only ride out a database error around the call: the inbox row commits before it, so a
    # redelivery after the call never cancels twice
    ctx.sync.cancel_requested(envelope)


@consumes(EventType.FETCH_REQUESTED, max_retries=3, min_backoff=1_000, max_backoff=60_000, time_limit=900_000)
def fetch_output(ctx: AppContext, envelope: Envelope) -> None:
    # failures of the download itself are retried by the service within its budget (delayed outbox row);
    # broker retries only cover a crash or a database error around it
    ctx.output_fetch.handle(envelope)


@consumes(EventType.MEDIA_PROCESS_REQUESTED, max_retries=3, min_backoff=1_000, max_backoff=60_000, time_limit=1_800_000)
def process_media(ctx: AppContext, envelope: Envelope) -> None:
    ctx.media.handle(envelope)


@consumes(EventType.TASK_STATUS_CHANGED, max_retries=5, min_backoff=500, max_backoff=30_000, time_limit=30_000)
def notify_status_changed(ctx: AppContext, envelope: Envelope) -> None:
    # the durable side of a status change, PostgreSQL only: nothing here waits on Redis, so its retries only
    # ride out a database error. The client webhooks: deliveries written once per event (their own inbox group),
    # sent by deliver_webhook on their own queue
    ctx.webhooks.fan_out(envelope)
    if notifications.is_terminal(envelope):  # a System B vendor step waiting on this task finishes with it
        ctx.workflow_runner.finish_waiting(envelope.aggregate_id)
        notifications.log_summary(ctx.engine, envelope.aggregate_id)


@consumes(
    EventType.TASK_STATUS_CHANGED, STATUS_SIGNAL, max_retries=0, min_backoff=1_000, max_backoff=1_000, time_limit=10_000
)
def signal_status_changed(ctx: AppContext, envelope: Envelope) -> None:
    # max_retries=0: the SSE wake-up is best effort (a Redis failure is logged and counted by the notifier); a
    # stream that missed it catches up from the state events on its next heartbeat, so no retry is worth a worker
    notifications.signal(ctx.notifier, envelope)


#: a step actor outlives the longest local step of any queue (composition: 30 min); the sweeper's
#: timeout scan, not this, is what ends a step that overruns its own type's timeout
STEP_TIME_LIMIT_MS = (max(spec.timeout_s for spec in STEP_SPECS.values()) + 300) * 1000


@consumes(EventType.STEP_DUE, max_retries=3, min_backoff=1_000, max_backoff=30_000, time_limit=STEP_TIME_LIMIT_MS)
def run_step(ctx: AppContext, envelope: Envelope) -> None:
    # one actor per step queue (`run_step_<queue>`), all this function: claim the queue's best due step within
    # the limits and run it. A broker retry only follows an error around the claim; the step row is the truth.
    ctx.workflow_runner.run_due(step_queue(envelope))


@consumes(
    EventType.WEBHOOK_DELIVERY_REQUESTED, max_retries=3, min_backoff=1_000, max_backoff=30_000, time_limit=180_000
)
def deliver_webhook(ctx: AppContext, envelope: Envelope) -> None:
    # failed attempts are retried by the service within [retry.notification] (a delayed outbox row); broker
    # retries only cover a database error around the attempt. time_limit exceeds client_webhooks.timeout_s (≤ 120)
    attempts = envelope.payload.get("attempts")
    ctx.webhook_deliverer.deliver(
        uuid.UUID(envelope.payload["delivery_id"]), attempts if isinstance(attempts, int) else None
    )


def step_queue(envelope: Envelope) -> str:
    """The step queue a `workflow.step.due` message wakes; InvalidEnvelope (no retry) for anything else."""
    queue = envelope.payload.get("queue")
    if queue not in {q.value for q in QueueName}:
        raise InvalidEnvelope(f"payload.queue: not a step queue: {queue!r}")
    return str(queue)


def declare_actors(broker: dramatiq.Broker, ctx: AppContext) -> dict[str, dramatiq.Actor[Any, Any]]:
    """Declare every registered consumer on `broker`, bound to `ctx`; returns them by actor name."""
    declared: dict[str, dramatiq.Actor[Any, Any]] = {}
    for spec in REGISTRY.values():
        for route in spec.routes:
            # dramatiq.actor(fn, **options) is dramatiq.actor(**options)(fn); only the latter is in its type hints
            declared[route.actor] = dramatiq.actor(
                broker=broker,
                actor_name=route.actor,
                queue_name=route.queue.value,
                priority=route.priority,
                **spec.options,
            )(_bind(spec.handler, ctx, route.actor))
    declared[REDUCE_BATCH.actor] = _declare_reduce_batch(broker, ctx)
    return declared


def _declare_reduce_batch(broker: dramatiq.Broker, ctx: AppContext) -> dramatiq.Actor[Any, Any]:
    """The batched reducer (`services.reducer_batch`): many observations, one transaction. An event that fails on
    its own goes again as a one-event message, with that actor's retries and dead letter; so a broker retry of the
    batch only follows an error around it (the database down), and a re-run finds its done events in the inbox."""
    route = ROUTES[EventType.PROVIDER_STATUS_OBSERVED]
    single = REGISTRY[route.actor]

    def reduce_provider_statuses(bodies: list[Any]) -> None:
        parsed: list[Envelope] = []
        alone: list[Any] = []
        for body in bodies if isinstance(bodies, list) else [bodies]:
            try:
                parsed.append(Envelope.parse(body))
            except (InvalidEnvelope, AttributeError, TypeError):
                alone.append(body)  # dead-lettered by the one-event actor, where replay can see it
        with measure_actor(REDUCE_BATCH.actor):
            result = reducer_batch.reduce_many(
                ctx.engine, parsed, ctx.clock.now(), ctx.settings.fetch.urgent_within_s, slots=ctx.slots
            )
        for envelope, error in result.failed:
            log.warning("observation %s failed in a batch and alone (%s); sent again alone", envelope.event_id, error)
            alone.append(envelope.to_dict())
        for body in alone:
            event_id = body.get("event_id") if isinstance(body, dict) else None
            message = message_of(body, route, str(event_id or uuid.uuid4()))
            broker.enqueue(message, delay=single.options["min_backoff"])

    reduce_provider_statuses.__module__ = __name__
    return dramatiq.actor(
        broker=broker,
        actor_name=REDUCE_BATCH.actor,
        queue_name=REDUCE_BATCH.queue.value,
        priority=REDUCE_BATCH.priority,
        max_retries=single.options["max_retries"],
        min_backoff=single.options["min_backoff"],
        max_backoff=single.options["max_backoff"],
        time_limit=2 * single.options["time_limit"],
    )(reduce_provider_statuses)


def _bind(handler: Handler, ctx: AppContext, name: str) -> Callable[[dict[str, Any]], None]:
    def actor(envelope: dict[str, Any]) -> None:
        parsed = Envelope.parse(envelope)
        with task_context(parsed), measure_actor(name):  # every line logged by the handler carries its task ids
            handler(ctx, parsed)

    actor.__name__ = actor.__qualname__ = name
    actor.__module__ = handler.__module__
    return actor
