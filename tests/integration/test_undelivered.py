"""The in-memory broker's unfinished messages go back to the outbox when the process stops (worker.undelivered).

Without it, a message the StubBroker still held at shutdown (queued, prefetched, waiting out a retry) was lost
with the process while its outbox row said PUBLISHED, and only the sweeper's stuck-task window noticed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import sqlalchemy as sa

from aivedio_engine.db.tables import outbox_events
from aivedio_engine.worker import undelivered
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import make_context, tenant_with_key
from tests.support.sim import wait_until


def _statuses(ctx: object) -> dict[str, str]:
    with ctx.engine.connect() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(sa.select(outbox_events.c.id, outbox_events.c.status)).all()
    return {str(r.id): r.status for r in rows}


def test_messages_nobody_consumed_are_pending_again_after_shutdown(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data")
    who = tenant_with_key(ctx, "alice", credits=100)
    runtime = Runtime(ctx, {"relay"}, threading.Event())  # no worker: every published message stays queued
    runtime.start()
    try:
        ctx.generations.create(
            who.tenant_id, "k", {"prompt": "fog over a harbour", "model": "local-v1", "duration_s": 1}
        )
        wait_until(lambda: set(_statuses(ctx).values()) == {"PUBLISHED"}, timeout_s=30, what="published")
        published = set(_statuses(ctx))
        assert runtime.broker is not None
        assert set(undelivered.of(runtime.broker).open_ids()) == published  # type: ignore[union-attr]
    finally:
        runtime.shutdown()
    try:
        assert _statuses(ctx) == dict.fromkeys(published, "PENDING")  # the next run publishes them at once
    finally:
        ctx.close()


def test_messages_the_worker_finished_stay_published(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data")
    who = tenant_with_key(ctx, "bob", credits=100)
    runtime = Runtime(ctx, {"relay", "worker"}, threading.Event())
    runtime.start()
    try:
        ctx.generations.create(who.tenant_id, "k", {"prompt": "a kite", "model": "local-v1", "duration_s": 1})
        assert runtime.broker is not None
        tracker = undelivered.of(runtime.broker)
        assert tracker is not None
        wait_until(
            lambda: set(_statuses(ctx).values()) == {"PUBLISHED"} and not tracker.open_ids(),
            timeout_s=30,
            what="every message consumed",
        )
    finally:
        runtime.shutdown()
    try:
        assert set(_statuses(ctx).values()) == {"PUBLISHED"}
    finally:
        ctx.close()


def test_a_retry_hop_keeps_the_message_open_until_its_last_delivery_is_acked() -> None:
    tracker = undelivered.Undelivered()
    m = SimpleNamespace(message_id="m1")
    tracker.after_enqueue(None, m, None)  # type: ignore[arg-type]  # published
    tracker.after_enqueue(None, m, 1000)  # type: ignore[arg-type]  # the failed delivery re-enqueued with a delay
    tracker.after_ack(None, m)  # type: ignore[arg-type]  # ... then acked
    assert tracker.open_ids() == ["m1"]
    tracker.after_enqueue(None, m, None)  # type: ignore[arg-type]  # moved from the delay queue
    tracker.after_ack(None, m)  # type: ignore[arg-type]
    assert tracker.open_ids() == ["m1"]
    tracker.after_nack(None, m)  # type: ignore[arg-type]  # the last try failed for good: dead-lettered, recorded
    assert tracker.open_ids() == []
