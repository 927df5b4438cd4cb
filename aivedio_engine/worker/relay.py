"""The outbox relay: PENDING outbox rows → broker messages (message_id = event_id) → PUBLISHED.

Provider status observations of one claim go up to `reducer_batch` to a message (`messages`), reduced in one
transaction by `reduce_provider_statuses`; such a message has an id of its own and carries its events' envelopes.
A row whose target has other consumers too (`ALSO_PUBLISHED_TO`: the SSE wake-up of a status change) goes to each
as a message of its own, under an id derived from the row's; the row is PUBLISHED once all of them are enqueued.

At least once, never lost: rows are claimed, enqueued and marked in one short transaction, so a crash after an
enqueue but before the commit leaves the row PENDING and it is published again (consumers dedup by event id).
On PostgreSQL, `FOR UPDATE SKIP LOCKED` lets any number of relays share the table without claiming a row twice;
on SQLite (embedded, one process) `BEGIN IMMEDIATE` serializes relays instead. Holding the row locks while
enqueueing is deliberate: the broker call is a local, fast one, and it is the only I/O inside the transaction.

Wake-up without slow polling: PostgreSQL `LISTEN aivedio_outbox` on a dedicated connection (the writer's process
sends the NOTIFY after the commit that inserted the row, so it arrives only once the row is visible:
`db.wakeup`); embedded mode waits on the in-process event set after such a commit. A periodic check
(`fallback_interval_s`) covers lost notifications and rows whose `available_at` lies in the future.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dramatiq
from dramatiq.errors import BrokerConnectionError

from aivedio_engine.clock import Clock
from aivedio_engine.db import outbox_relay
from aivedio_engine.db.engine import SQLITE_BEGIN_OPTION
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.outbox import NOTIFY_CHANNEL
from aivedio_engine.db.records import OutboxRow
from aivedio_engine.db.wakeup import Waiter
from aivedio_engine.domain.events import ALSO_PUBLISHED_TO, BY_ACTOR, REDUCE_BATCH, ROUTES, EventType, Route
from aivedio_engine.services.consume import Envelope
from aivedio_engine.testing.failpoints import failpoint
from aivedio_engine.worker.dead_letters import one_line_error

log = logging.getLogger(__name__)

try:  # the Redis client is only present with dramatiq[redis]; embedded mode does not need it
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.exceptions import TimeoutError as _RedisTimeoutError

    _BROKER_DOWN: tuple[type[BaseException], ...] = (
        BrokerConnectionError,
        _RedisConnectionError,
        _RedisTimeoutError,
        ConnectionError,
    )
except ImportError:  # pragma: no cover
    _BROKER_DOWN = (BrokerConnectionError, ConnectionError)

#: how often a waiting relay checks its stop event; not a database poll
_STOP_CHECK_S = 0.25


@dataclass(frozen=True)
class BatchResult:
    claimed: int = 0
    published: int = 0
    failed: int = 0


class Relay:
    """Publishes due outbox rows to `broker`.

    Args:
        engine: the database (PostgreSQL or SQLite).
        broker: the Dramatiq broker messages are enqueued on.
        clock: "due" means `available_at <= clock.now()`.
        batch_size: rows claimed per transaction.
        max_publish_attempts: failed enqueues of one row before it is marked DEAD.
        wakeup: embedded mode: set after a commit that wrote outbox rows (`AppContext.outbox_wakeup`).
        fallback_interval_s: longest wait between two checks without any wake-up.
        retry_backoff_s, retry_backoff_max_s: a failed row is retried after base × 2^attempts, capped.
        error_backoff_s: pause after a batch that failed as a whole (database down, failpoint).
        reducer_batch: up to this many `provider.status.observed` rows of one claim go as one message, reduced in
            one transaction (`services.reducer_batch`); 1 sends each alone.
    """

    def __init__(
        self,
        engine: Engine,
        broker: dramatiq.Broker,
        clock: Clock,
        *,
        batch_size: int = 200,
        max_publish_attempts: int = 10,
        wakeup: threading.Event | None = None,
        fallback_interval_s: float = 1.0,
        retry_backoff_s: float = 1.0,
        retry_backoff_max_s: float = 300.0,
        error_backoff_s: float = 1.0,
        reducer_batch: int = 1,
    ) -> None:
        if batch_size < 1 or max_publish_attempts < 1 or reducer_batch < 1:
            raise ValueError("batch_size, max_publish_attempts and reducer_batch must be >= 1")
        self.engine = engine
        self.broker = broker
        self.clock = clock
        self.batch_size = batch_size
        self.max_publish_attempts = max_publish_attempts
        self.wakeup = wakeup
        self.fallback_interval_s = fallback_interval_s
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.error_backoff_s = error_backoff_s
        self.reducer_batch = reducer_batch
        #: set once run_forever is listening and has drained what was due at start
        self.ready = threading.Event()
        self.published_total = 0
        self.failed_total = 0
        self._postgres = engine.dialect.name == "postgresql"

    # --- one batch ---------------------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Claim up to `batch_size` due rows, publish them, commit; returns how many were published."""
        return self.run_batch().published

    def run_batch(self) -> BatchResult:
        now = self.clock.now()
        with self.engine.connect() as conn:
            if not self._postgres:
                conn = conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            with conn.begin():
                rows = outbox_relay.claim_due(conn, now, self.batch_size)
                if not rows:
                    return BatchResult()
                failpoint("relay.after_claim")
                published, failures = self._enqueue_all(rows)
                if published:
                    outbox_relay.mark_published(conn, published, now)
                for row, error in failures:
                    self._record_failure(conn, row, error, now)
                failpoint("relay.before_commit")
        failpoint("relay.after_commit")
        self.published_total += len(published)
        self.failed_total += len(failures)
        log.debug("outbox batch: claimed %d, published %d, failed %d", len(rows), len(published), len(failures))
        return BatchResult(claimed=len(rows), published=len(published), failed=len(failures))

    def _enqueue_all(self, rows: Sequence[OutboxRow]) -> tuple[list[uuid.UUID], list[tuple[OutboxRow, BaseException]]]:
        published: list[uuid.UUID] = []
        failures: list[tuple[OutboxRow, BaseException]] = []
        for group, message in messages(rows, self.reducer_batch):
            try:
                if isinstance(message, Exception):
                    raise message
                self.broker.enqueue(message)
            except Exception as exc:  # noqa: BLE001 - any failure is recorded on the row, never lost
                failures.extend((row, exc) for row in group)
                if isinstance(exc, _BROKER_DOWN):
                    # the rest would fail the same way; they stay PENDING without spending an attempt
                    break
                continue
            failpoint("relay.after_enqueue")
            published.extend(row.id for row in group)
        # a row with several messages is published once all of them are; else it goes again whole (its consumers
        # dedupe), so one failure of it wins over its enqueued messages and is recorded once
        failed = {row.id: (row, exc) for row, exc in failures}
        return [i for i in dict.fromkeys(published) if i not in failed], list(failed.values())

    def _record_failure(self, conn: Connection, row: OutboxRow, exc: BaseException, now: datetime) -> None:
        attempts = row.publish_attempts + 1
        dead = attempts >= self.max_publish_attempts
        delay = min(self.retry_backoff_s * 2 ** (attempts - 1), self.retry_backoff_max_s)
        error = one_line_error(exc)
        outbox_relay.record_failure(
            conn,
            row.id,
            attempts=attempts,
            error=error,
            dead=dead,
            available_at=now if dead else now + timedelta(seconds=delay),
        )
        log.warning(
            "outbox %s: publish attempt %d/%d failed%s: %s",
            row.id,
            attempts,
            self.max_publish_attempts,
            " — marked DEAD" if dead else "",
            error,
        )

    # --- the loop ----------------------------------------------------------------------------------------------

    def run_forever(self, stop: threading.Event) -> None:
        """Publish until `stop` is set; returns within a fraction of a second of it."""
        waiter = Waiter(self.engine, NOTIFY_CHANNEL, self.wakeup)
        try:
            waiter.listen()  # before the first claim: a commit racing with it still wakes the next wait
            while not stop.is_set():
                try:
                    result = self.run_batch()
                except Exception:  # a database or failpoint error must not end the relay
                    log.exception("outbox relay batch failed; retrying in %.1fs", self.error_backoff_s)
                    stop.wait(self.error_backoff_s)
                    continue
                self.ready.set()
                if result.claimed >= self.batch_size and not result.failed:
                    continue  # a backlog: keep draining without waiting
                self._wait(waiter, stop)
        finally:
            waiter.close()

    def _wait(self, waiter: Waiter, stop: threading.Event) -> None:
        """Block until a wake-up, the fallback interval or `stop`."""
        deadline = time.monotonic() + self.fallback_interval_s
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waiter.wait(min(remaining, _STOP_CHECK_S)):
                return


_REDUCER = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor


def messages(
    rows: Sequence[OutboxRow], reducer_batch: int = 1
) -> list[tuple[list[OutboxRow], dramatiq.Message[Any] | Exception]]:
    """The broker messages for claimed rows, each with the rows it carries: one message per row, except that the
    reducer's rows go `reducer_batch` at a time in one `reduce_provider_statuses` message. A row this build
    cannot route gets its error in place of a message (recorded on that row alone)."""
    out: list[tuple[list[OutboxRow], dramatiq.Message[Any] | Exception]] = []
    batch: list[tuple[OutboxRow, Envelope]] = []

    def flush() -> None:
        if len(batch) == 1:
            out.append(([batch[0][0]], message_of(batch[0][1].to_dict(), BY_ACTOR[_REDUCER], str(batch[0][0].id))))
        elif batch:
            bodies = [envelope.to_dict() for _, envelope in batch]
            # its own id: under an event's id it could overwrite that event's one-event message in a Redis queue
            out.append(([row for row, _ in batch], message_of(bodies, REDUCE_BATCH, str(uuid.uuid4()))))
        batch.clear()

    for row in rows:
        try:
            envelope = _envelope(row)
        except ValueError as exc:
            out.append(([row], exc))
            continue
        if reducer_batch > 1 and row.target == _REDUCER:
            batch.append((row, envelope))
            if len(batch) >= reducer_batch:
                flush()
        else:
            body = envelope.to_dict()
            out.append(([row], message_of(body, BY_ACTOR[row.target], str(row.id))))
            for route in ALSO_PUBLISHED_TO.get(row.target, ()):
                # not the row's id: in a Redis queue a second message under it would overwrite the first
                out.append(([row], message_of(body, route, str(uuid.uuid5(row.id, route.actor)))))
    flush()
    return out


def _message(row: OutboxRow) -> dramatiq.Message[Any]:
    """The broker message for one outbox row; ValueError for an event type this build does not route."""
    return message_of(_envelope(row).to_dict(), BY_ACTOR[row.target], str(row.id))


def _envelope(row: OutboxRow) -> Envelope:
    EventType(row.event_type)  # an unknown type raises ValueError: this build does not route it
    if row.target not in BY_ACTOR:
        raise ValueError(f"target {row.target!r} is not an actor of this build")
    occurred_at = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    return Envelope(
        event_id=row.id,
        event_type=row.event_type,
        schema_version=row.schema_version,
        aggregate_id=row.aggregate_id,
        aggregate_version=row.aggregate_version,
        tenant_id=row.tenant_id,
        trace_id=row.trace_id,
        causation_id=row.causation_id,
        occurred_at=occurred_at,
        payload=row.payload,
    )


def message_of(body: Any, route: Route, message_id: str) -> dramatiq.Message[Any]:
    """A message to `route`'s actor carrying `body` (an envelope, or a list of them for the batched reducer)."""
    return dramatiq.Message(
        queue_name=route.queue.value,
        actor_name=route.actor,
        args=(body,),
        kwargs={},
        options={},
        message_id=message_id,
    )
