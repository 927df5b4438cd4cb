"""In-memory broker only: hand the messages a stopping process still held back to the outbox.

The StubBroker's queues live in this process. Its consumer cannot requeue (Dramatiq's stub `requeue` is a
no-op), so whatever it had not finished when the worker stopped — messages still queued, prefetched, waiting
out a retry delay, or held by an actor that outlived the stop timeout — would vanish with the process while
their outbox rows say PUBLISHED, and only the sweeper's stuck-task windows (minutes) would notice. `Undelivered`
counts each message's event ids in (enqueued) and out (acked or nacked: done, or dead-lettered and recorded); at
shutdown `hand_back` turns the rows of those still open back to PENDING, so the next run publishes them at once.
Consumers dedupe by event id, so a message that did finish its effect but not its ack is harmless to resend.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import dramatiq

from aivedio_engine.db import outbox_relay
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.events import REDUCE_BATCH


class Undelivered(dramatiq.Middleware):
    """Message ids this process's broker was given and has not finished (enqueued minus acked/nacked).

    Counts, not a set: a retry re-enqueues the same id (to the delay queue, then back) before the failed
    delivery is acked, and every hop is one enqueue and one ack."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    def after_enqueue(self, broker: dramatiq.Broker, message: Any, delay: Any) -> None:
        with self._lock:
            for event_id in _event_ids(message):
                self._open[event_id] += 1

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        self._done(message)

    def after_nack(self, broker: dramatiq.Broker, message: Any) -> None:
        self._done(message)

    def _done(self, message: Any) -> None:
        with self._lock:
            for event_id in _event_ids(message):
                self._open[event_id] -= 1
                if self._open[event_id] <= 0:
                    del self._open[event_id]

    def open_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._open)


def _event_ids(message: Any) -> list[str]:
    """The outbox events a message carries: its envelope's event id, or each envelope's of a batched reducer
    message (whose own id is not an event's). Not the message id alone: a row published to a second consumer (the
    SSE signal of a status change) goes out under a derived id, and either message left unfinished hands the row
    back, so neither is lost (both consumers dedupe a repeat)."""
    args = getattr(message, "args", None)
    if getattr(message, "actor_name", None) == REDUCE_BATCH.actor and args and isinstance(args[0], list):
        return [str(body.get("event_id")) for body in args[0] if isinstance(body, dict)]
    if args and isinstance(args[0], dict) and args[0].get("event_id"):
        return [str(args[0]["event_id"])]
    return [message.message_id]


def of(broker: dramatiq.Broker) -> Undelivered | None:
    return next((m for m in broker.middleware if isinstance(m, Undelivered)), None)


def hand_back(engine: Engine, broker: dramatiq.Broker, now: datetime) -> int:
    """Outbox rows of the messages `broker` never finished → PENDING, due now. Returns how many rows changed.

    Call once the worker and relay have stopped (nothing may consume or publish meanwhile)."""
    tracker = of(broker)
    if tracker is None:
        return 0
    ids = []
    for message_id in tracker.open_ids():
        try:
            ids.append(uuid.UUID(message_id))
        except ValueError:
            continue  # not an outbox event (enqueued directly, e.g. by a test)
    if not ids:
        return 0
    with engine.begin() as conn:
        return outbox_relay.hand_back(conn, ids, now)
