"""Drive the pipeline in-process and deterministically: outbox rows are handed to the same service functions
the Dramatiq actors call, in order, without a broker. Broker delivery itself is tested elsewhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import outbox_events
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services.consume import Envelope
from aivedio_engine.worker.actors import REGISTRY


class Pump:
    def __init__(self, ctx: AppContext, *, duplicate_every: int = 0, stop_at_fetch: bool = False) -> None:
        self.ctx = ctx
        self.seen: Counter[str] = Counter()
        #: deliver every n-th event twice (0 = never), as a redelivering broker would
        self.duplicate_every = duplicate_every
        self.parked: list[dict] = []  # events without a registered consumer, or held back by stop_at_fetch
        #: control-plane tests end at OUTPUT_FETCHING: the fetch request is parked, no download or transcode runs
        self.held = {EventType.FETCH_REQUESTED.value} if stop_at_fetch else set()

    def _handlers(self) -> dict[str, Callable[[Envelope], None]]:
        """The registered consumers, exactly as the Dramatiq actors call them: every consumer of an event type
        in turn (the one its rows name, then those the relay also publishes them to)."""
        by_type: dict[str, list[Callable[[AppContext, Envelope], None]]] = {}
        for spec in REGISTRY.values():
            if spec.event_type.value not in self.held:
                by_type.setdefault(spec.event_type.value, []).append(spec.handler)

        def each(handlers: list[Callable[[AppContext, Envelope], None]]) -> Callable[[Envelope], None]:
            def run(env: Envelope) -> None:
                for handler in handlers:
                    handler(self.ctx, env)

            return run

        return {event_type: each(handlers) for event_type, handlers in by_type.items()}

    def run(self, max_events: int = 10_000) -> int:
        """Deliver every pending outbox row once (some twice); returns how many were delivered."""
        handlers = self._handlers()
        delivered = 0
        while delivered < max_events:
            with self.ctx.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(outbox_events)
                    .where(
                        outbox_events.c.status == OutboxStatus.PENDING.value,
                        outbox_events.c.available_at <= self.ctx.clock.now(),
                    )
                    .order_by(outbox_events.c.id)
                    .limit(200)
                ).all()
            if not rows:
                return delivered
            for row in rows:
                env = Envelope(
                    event_id=row.id,
                    event_type=row.event_type,
                    schema_version=row.schema_version,
                    aggregate_id=row.aggregate_id,
                    aggregate_version=row.aggregate_version,
                    tenant_id=row.tenant_id,
                    trace_id=row.trace_id,
                    causation_id=row.causation_id,
                    occurred_at=row.created_at,
                    payload=row.payload,
                )
                handler = handlers.get(row.event_type)
                if handler is None:
                    self.parked.append({"event_type": row.event_type, **row.payload})
                else:
                    times = 2 if self.duplicate_every and delivered % self.duplicate_every == 0 else 1
                    for _ in range(times):
                        handler(env)
                        self.seen[row.event_type] += 1
                with self.ctx.engine.begin() as conn:
                    conn.execute(
                        outbox_events.update()
                        .where(outbox_events.c.id == row.id)
                        .values(status=OutboxStatus.PUBLISHED.value, published_at=self.ctx.clock.now())
                    )
                delivered += 1
        return delivered
