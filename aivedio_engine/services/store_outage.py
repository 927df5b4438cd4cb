"""Our object store failing under a data-plane step: the step is held, and the on-call engineer is told.

The fetch and media steps do not judge an output by a failure of our own store: the exception
propagates, the task stays OUTPUT_FETCHING / POST_PROCESSING with no try spent, and the broker's retries, then
the sweeper's re-drive, run the step again once the store answers. Without more, such an outage showed only as
log lines and dead letters while paid outputs waited (and a provider's output URLs may expire meanwhile). So
every such failure also raises one `storage_unavailable` alert per store — the rule's dedup key is the store, so
a long outage bumps `last_seen_at` of that one alert instead of paging once per task.

Only the store's own calls are watched, and only failures that are not an answer: `ObjectNotFound` and
`ObjectTooLarge` are what a working store says about one object, and the steps handle them themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

from aivedio_engine.clock import Clock
from aivedio_engine.db import alerts
from aivedio_engine.db.handles import Engine
from aivedio_engine.domain.status import AlertSeverity
from aivedio_engine.storage.base import ObjectNotFound, ObjectStore, ObjectTooLarge

log = structlog.get_logger("aivedio.storage")

#: what a working store answers about one object: not an outage
ANSWERS: tuple[type[Exception], ...] = (ObjectNotFound, ObjectTooLarge)


@contextmanager
def watched(
    engine: Engine,
    clock: Clock,
    store: ObjectStore,
    *,
    step: str,
    task_id: uuid.UUID,
    answers: tuple[type[Exception], ...] = (),
) -> Iterator[None]:
    """Run store calls of `step`; a failure other than an answer (`ANSWERS` + `answers`, e.g. the fetcher's own
    errors raised through a streaming upload) raises the alert, then propagates unchanged."""
    try:
        yield
    except (*ANSWERS, *answers):
        raise
    except Exception as exc:
        report(engine, clock, store, exc, step=step, task_id=task_id)
        raise


def report(
    engine: Engine,
    clock: Clock,
    store: ObjectStore,
    exc: Exception,
    *,
    step: str,
    task_id: uuid.UUID,
) -> None:
    where = f"{store.kind} {store.bucket}"
    error = f"{type(exc).__name__}: {exc}"[:500]
    log.warning("object store failed; the task is held", store=where, step=step, task_id=str(task_id), error=error)
    try:
        with engine.begin() as conn:
            alerts.raise_alert(
                conn,
                alerts.Rule.STORAGE_UNAVAILABLE,
                AlertSeverity.CRITICAL,
                dedup_key=f"{store.kind}:{store.bucket}",
                message=(
                    f"the object store ({where}) failed in the {step} step: {error}. Tasks wait in OUTPUT_FETCHING / "
                    "POST_PROCESSING with no try spent and resume when it answers; nothing is failed or charged for "
                    "it. Check the store with `aivedio doctor` and [storage] (endpoint, credentials, bucket): a "
                    "provider's output URLs may expire meanwhile (docs/runbooks.md, object store unavailable)"
                ),
                now=clock.now(),
                subject_type="storage",
                subject_id=where,
                details={"step": step, "task_id": str(task_id), "error": error},
            )
    except Exception as alert_exc:  # noqa: BLE001 - the step's own failure is what propagates; this is a report
        log.error("could not record the storage_unavailable alert", error=f"{type(alert_exc).__name__}: {alert_exc}")
