"""Dramatiq middleware that records every message Dramatiq gives up on in the `dead_letters` table.

Redis forgets its dead-letter queue after 7 days and the StubBroker keeps it only in memory, so the database is
the record operators replay from. The row is written in `before_nack`, i.e. before the broker moves the message
to its own DLQ: if this process dies in between, the message is redelivered and recorded again (seen_count
grows) rather than existing only in Redis. A failure to write is logged by Dramatiq and the nack still happens,
so a database outage cannot wedge a worker.

A dead letter of a notification actor (a client's webhook, the status change behind it) also raises
`notification_dead_lettered` in the same transaction, one open alert per actor: nobody is told about the task until
an operator replays it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy

from aivedio_engine.clock import new_id
from aivedio_engine.config import mask_secrets
from aivedio_engine.db import alerts
from aivedio_engine.db import dead_letters as repo
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.events import NOTIFICATION_ACTORS, STATUS_SIGNAL
from aivedio_engine.domain.status import AlertSeverity

log = logging.getLogger(__name__)

#: enough of the traceback to see where it failed without storing a whole stack per message
TRACEBACK_TAIL_CHARS = 4000
ERROR_CHARS = 500


class DeadLetters(dramatiq.Middleware):
    """Upsert a `dead_letters` row (by message id, counting repeats) when a message is rejected.

    Args:
        engine: a callable returning the Engine, so the broker can be built before the database is touched.
        now: the injected clock's `now`.
    """

    def __init__(self, engine: Callable[[], Engine], now: Callable[[], datetime]) -> None:
        self._engine = engine
        self._now = now

    def before_nack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        record(self._engine(), message, self._now())


def record(engine: Engine, message: MessageProxy | dramatiq.Message, now: datetime) -> None:
    """Insert or bump the dead-letter row of `message`."""
    exc: BaseException | None = getattr(message, "_exception", None)
    options = dict(message.options)
    tb = options.pop("traceback", None) or ("".join(traceback.format_exception(exc)) if exc is not None else None)
    body = {
        "queue_name": message.queue_name,
        "actor_name": message.actor_name,
        "args": list(message.args),
        "kwargs": message.kwargs,
        "options": options,
        "message_id": message.message_id,
        "message_timestamp": message.message_timestamp,
    }
    row: dict[str, Any] = {
        "id": new_id(),
        "message_id": message.message_id,
        "actor": message.actor_name,
        "queue": message.queue_name.removesuffix(".DQ"),
        "message": body,
        "error": one_line_error(exc) if exc is not None else "rejected without an exception (e.g. age limit)",
        "traceback_tail": mask_secrets(tb[-TRACEBACK_TAIL_CHARS:]) if tb else None,
        "first_seen_at": now,
        "last_seen_at": now,
    }
    with engine.begin() as conn:
        repo.upsert(conn, row)
        if row["actor"] in NOTIFICATION_ACTORS:
            actor = row["actor"]
            alerts.raise_alert(
                conn,
                alerts.Rule.NOTIFICATION_DEAD_LETTERED,
                AlertSeverity.CRITICAL,
                dedup_key=actor,
                subject_type="actor",
                subject_id=actor,
                message=f"{actor}: a notification message was given up on ({row['error']}); {_next_step(actor)}",
                details={"message_id": row["message_id"], "queue": row["queue"]},
                now=now,
            )
    log.warning("dead letter recorded: actor=%s message_id=%s error=%s", row["actor"], row["message_id"], row["error"])


def _next_step(actor: str) -> str:
    if actor == STATUS_SIGNAL.actor:  # not an outbox consumer: nothing to replay, and nothing is lost
        return "the SSE streams catch up from the state events by themselves"
    return f"fix the cause, then `aivedio replay dlq --actor {actor}`"


def one_line_error(exc: BaseException) -> str:
    """`Type: first line of the message`, credentials in URLs masked, bounded."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return mask_secrets(line)[:ERROR_CHARS]
