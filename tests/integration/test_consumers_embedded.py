"""Embedded mode end to end: SQLite + StubBroker + the runtime's relay thread and Dramatiq worker threads.

Duplicates are injected the way they happen in production: the relay's second batch is enqueued and then its
transaction fails before commit (failpoint `relay.before_commit=raise@2`), so those rows stay PENDING and are
published again. Every event must still be consumed once: one inbox row and one task update each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services import intake
from aivedio_engine.testing import failpoints
from aivedio_engine.worker.runtime import Runtime
from tests.chaos.support import (
    effects_per_task,
    inbox_count,
    insert_queued_events,
    insert_tasks,
    insert_tenant,
    install_effect_counter,
    outbox_statuses,
    wait_until,
)

N = 500


@pytest.fixture(autouse=True)
def _disarm_failpoints() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


def test_embedded_relay_and_workers_consume_every_event_once_despite_republished_batch(tmp_path: Any) -> None:
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path), "broker": {"worker_threads": 4}}))
    migrate.upgrade(ctx.engine)
    with ctx.engine.begin() as conn:
        install_effect_counter(conn)
        tenant = insert_tenant(conn)
        tasks = insert_tasks(conn, tenant, N)
        insert_queued_events(conn, tenant, tasks)
    failpoints.configure("relay.before_commit=raise@2;relay.after_enqueue=count;consume.duplicate=count")

    stop = threading.Event()
    runtime = Runtime(ctx, {"relay", "worker"}, stop)
    started = time.monotonic()
    runtime.start()
    try:
        wait_until(lambda: inbox_count(ctx.engine, intake.CONSUMER_GROUP) == N, 60, f"{N} inbox rows")
        wait_until(lambda: outbox_statuses(ctx.engine) == {OutboxStatus.PUBLISHED.value: N}, 30, "all PUBLISHED")
        enqueued = failpoints.hits("relay.after_enqueue")
        # every extra enqueue must reach a consumer and be recognised as a duplicate
        wait_until(
            lambda: failpoints.hits("consume.duplicate") == enqueued - N, 30, f"{enqueued - N} duplicate deliveries"
        )
        elapsed = time.monotonic() - started
    finally:
        runtime.shutdown()
    assert runtime.failed is None
    assert enqueued > N, "the failpoint did not make the relay publish a batch twice"
    effects = effects_per_task(ctx.engine)
    assert len(effects) == N and set(effects.values()) == {1}
    print(f"\nembedded: {N} events, {enqueued - N} duplicate deliveries, {N / elapsed:.0f} events/s")
    ctx.close()
