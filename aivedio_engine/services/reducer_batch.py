"""Many `provider.status.observed` events in one transaction: the reducer's batched path.

The relay puts up to `broker.reducer_batch` observations of one claim into one message
(`reduce_provider_statuses`). Reduced one per transaction, each event paid for a broker message, a pool
checkout, BEGIN with its reads, COMMIT and a WAL flush of its own; here a batch pays them once:

- one round trip: BEGIN and every event's four reads (inbox row, task and attempt locked, already seen);
- per event the same decision and writes as `reducer._reduce_pg`, on the rows just read;
- one round trip: every inbox digest and COMMIT.

The events are taken in (provider, job id) order, so two batches lock their tasks in one order. An event whose
job an earlier event of the same batch already moved is reduced on rows read again (`reducer.reduce`), never on
the batch's first read. Any error rolls the whole batch back; then each event is reduced on its own
(`reducer.reduce_observation`, one transaction each), so one bad event never holds the others and no event is
ever half applied. An event that fails on its own too is handed back (`BatchReduced.failed`): the actor sends
it again as a one-event message, which has its own broker retries and dead letter. SQLite (embedded mode) always
reduces one by one: it has no round trips to save.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from aivedio_engine.db import observing, wakeup
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import pg_transaction
from aivedio_engine.observability.logging import task_context
from aivedio_engine.observability.metrics import REDUCER_BATCH_FALLBACKS, REDUCER_BATCHES
from aivedio_engine.services import reducer
from aivedio_engine.services.after_commit import AfterCommit, finished_lease
from aivedio_engine.services.consume import DUPLICATE, PROCESSED, Envelope, Outcome
from aivedio_engine.slots.base import SlotStore
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger(__name__)


@dataclass
class BatchReduced:
    #: per envelope, in the order given; None where the event failed (it is in `failed`)
    outcomes: list[Outcome | None]
    #: events that failed when reduced on their own, with the error
    failed: list[tuple[Envelope, Exception]] = field(default_factory=list)
    #: True: the batch committed as one transaction; False: its events were reduced one by one
    together: bool = False


def reduce_many(
    engine: Engine,
    envelopes: Sequence[Envelope],
    now: datetime,
    urgent_fetch_s: float = 900,
    slots: SlotStore | None = None,
) -> BatchReduced:
    """Consume every event of `envelopes` exactly once in effect, together when the database allows it."""
    if len(envelopes) > 1 and engine.dialect.name == "postgresql":
        after = AfterCommit(engine, slots)
        try:
            outcomes = _together(engine, envelopes, now, urgent_fetch_s, after)
        except Exception as exc:  # noqa: BLE001 - rolled back as a whole; each event is tried on its own below
            REDUCER_BATCH_FALLBACKS.labels(type(exc).__name__).inc()
            log.info("reducer batch of %d rolled back (%s); reducing its events one by one", len(envelopes), exc)
        else:
            REDUCER_BATCHES.observe(len(envelopes))
            after.run()
            return BatchReduced(list(outcomes), together=True)
    return _one_by_one(engine, envelopes, now, urgent_fetch_s, slots)


def _one_by_one(
    engine: Engine, envelopes: Sequence[Envelope], now: datetime, urgent_fetch_s: float, slots: SlotStore | None
) -> BatchReduced:
    result = BatchReduced(outcomes=[])
    for envelope in envelopes:
        try:
            with task_context(envelope):  # each event's log lines carry its ids, as from the one-event actor
                result.outcomes.append(reducer.reduce_observation(engine, envelope, now, urgent_fetch_s, slots).outcome)
        except Exception as exc:  # noqa: BLE001 - handed back: the caller re-sends this event alone
            result.outcomes.append(None)
            result.failed.append((envelope, exc))
    return result


def _together(
    engine: Engine, envelopes: Sequence[Envelope], now: datetime, urgent_fetch_s: float, after: AfterCommit
) -> list[Outcome]:
    jobs = [(e.payload["provider"], e.payload["job_id"]) for e in envelopes]
    order = sorted(range(len(envelopes)), key=jobs.__getitem__)
    outcomes: list[Outcome] = [DUPLICATE] * len(envelopes)
    group = reducer.CONSUMER_GROUP
    with engine.connect() as conn:
        with pg_transaction(conn) as raw:
            batch = [_observed(envelopes[i]) for i in order]
            claims = observing.claim_many(raw, group=group, now=now, batch=batch)
            moved: set[tuple[str, str]] = set()
            digests = []
            for i, got in zip(order, claims, strict=True):
                envelope = envelopes[i]
                obs = envelope.payload
                job = jobs[i]
                if not got.fresh:
                    # the first delivery may have committed and died before freeing the slot
                    if got.attempt is not None and got.task is not None:
                        after.release(finished_lease(got.attempt, got.task.tenant_id))
                    continue
                with task_context(envelope):  # each event's log lines carry its ids, as from the one-event actor
                    if job in moved or got.attempt is None or got.task is None:
                        # read again under the lock this transaction holds: an earlier event may have moved the rows
                        digest = reducer.reduce(conn, obs, now, urgent_fetch_s, after)
                    else:
                        digest = reducer.reduce_locked(
                            conn, got.attempt, got.task, obs, now, urgent_fetch_s, after, got.seen
                        )
                moved.add(job)
                digests.append((envelope.event_id, digest))
                outcomes[i] = PROCESSED
            failpoint("consume.before_commit")
            failpoint("reducer.before_commit")
            observing.commit_many(raw, group=group, digests=digests)
        wakeup.flush_noted(engine, conn)
    failpoint("reducer.after_commit")
    return outcomes


def _observed(envelope: Envelope) -> observing.Observed:
    obs = envelope.payload
    return observing.Observed(
        event_id=envelope.event_id,
        aggregate_id=envelope.aggregate_id,
        provider=obs["provider"],
        job_id=obs["job_id"],
        source=obs["source"],
        dedup_key=obs["dedup_key"],
    )
