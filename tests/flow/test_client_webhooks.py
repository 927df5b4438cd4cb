"""Client webhooks through the real process roles in embedded mode (SQLite, relay → in-memory broker → Dramatiq
worker → HTTP) to real loopback receivers that verify every Standard Webhooks signature with the library."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db import webhooks as repo
from aivedio_engine.services import notifications
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import TenantKey, make_context, tenant_with_key
from tests.support.sim import wait_until
from tests.support.webhook_receiver import running_receiver

#: [retry.notification] small enough to watch in real time: caps 0.4 s, 1.2 s, 3.6 s
FAST_RETRY = {"max_attempts": 4, "base_delay_s": 0.4, "multiplier": 3, "max_delay_s": 10}


def context(tmp_path: Path, **overrides: Any) -> AppContext:
    overrides.setdefault("client_webhooks", {"allow_private_networks": True})
    return make_context(
        tmp_path / "data",
        polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0},
        sweeper={"interval_s": 0.5},
        **overrides,
    )


@pytest.fixture
def engine_roles() -> Iterator[Any]:
    started: list[Runtime] = []

    def start(ctx: AppContext, roles: set[str]) -> Runtime:
        runtime = Runtime(ctx, roles, threading.Event())
        runtime.start()
        started.append(runtime)
        return runtime

    yield start
    for runtime in started:
        runtime.shutdown()
        runtime.ctx.close()


def deliveries(ctx: AppContext, **filters: Any) -> list[repo.Delivery]:
    return ctx.webhooks.deliveries(**filters)


def queued_then_cancelled(ctx: AppContext, who: TenantKey, key: str) -> Any:
    """A real task whose one notifying transition is the cancel (no scheduler runs: it stays QUEUED till then)."""
    task = ctx.generations.create(who.tenant_id, key, {"prompt": "waves", "model": "local-v1", "duration_s": 2}).task
    return ctx.generations.cancel(who.tenant_id, task.id)


def test_a_real_task_s_status_changes_arrive_signed_in_order(tmp_path: Path, engine_roles: Any) -> None:
    ctx = context(tmp_path)
    who = tenant_with_key(ctx, "alice", credits=100)
    with running_receiver() as rx:
        created = ctx.webhooks.add(who.tenant_id, rx.url)
        rx.secrets.append(created.secret)
        assert created.secret.startswith("whsec_")
        engine_roles(ctx, {"relay", "worker", "scheduler", "sweeper"})
        task = ctx.generations.create(
            who.tenant_id, "k", {"prompt": "rain on a window", "model": "local-v1", "duration_s": 2}
        ).task

        wait_until(
            lambda: any(r.data["status"] == "SUCCEEDED" for r in rx.verified()), timeout_s=120, what="SUCCEEDED hook"
        )
        wait_until(lambda: {d.state for d in deliveries(ctx, task_id=task.id)} == {"DELIVERED"}, what="all delivered")
        history = notifications.history(ctx.engine, who.tenant_id, task.id)
        got = rx.verified()
        assert len(got) == rx.count(), "every message carried a valid signature"
        by_version = sorted(got, key=lambda r: r.data["version"])
        # exactly the changes the SSE stream shows from QUEUED on (creation writes the QUEUED notification with
        # the task), each once, with its version
        queued = next(e["version"] for e in history if e["status"] == "QUEUED")
        expected = [(e["status"], e["version"]) for e in history if e["version"] >= queued]
        assert [(r.data["status"], r.data["version"]) for r in by_version] == expected
        assert expected[-1][0] == "SUCCEEDED" and len(expected) >= 4
        assert all(r.data["id"] == str(task.id) and r.message["type"] == "task.status.changed" for r in got)
        assert len({r.headers["webhook-id"] for r in got}) == len(got)


def test_500s_are_retried_with_growing_backoff_then_delivered(tmp_path: Path, engine_roles: Any) -> None:
    ctx = context(tmp_path, retry={"notification": FAST_RETRY})
    who = tenant_with_key(ctx, "alice", credits=100)
    with running_receiver(script=[500, 500, 500, 200]) as rx:
        rx.secrets.append(ctx.webhooks.add(who.tenant_id, rx.url, ["CANCELED"]).secret)
        engine_roles(ctx, {"relay", "worker"})
        task = queued_then_cancelled(ctx, who, "k")
        wait_until(lambda: rx.count() == 4, timeout_s=30, what="four attempts")
        wait_until(lambda: deliveries(ctx)[0].state == "DELIVERED", what="DELIVERED")

    (delivery,) = deliveries(ctx)
    assert (delivery.attempts, delivery.last_status_code, delivery.last_error) == (4, 200, None)
    assert delivery.task_id == task.id
    got = rx.received
    assert all(r.verified_by for r in got) and [r.answered for r in got] == [500, 500, 500, 200]
    assert len({r.headers["webhook-id"] for r in got}) == 1, "one message id across its retries"
    assert len({r.body for r in got}) == 1, "the same bytes every time"
    gaps = [b.at - a.at for a, b in zip(got, got[1:], strict=False)]
    print(f"\nattempts 500,500,500,200; gaps between them: {[round(g, 2) for g in gaps]} s")
    # attempt n+1 waits at least half of min(max_delay, base * multiplier^n): 0.2 s, 0.6 s, 1.8 s
    assert [g >= cap / 2 for g, cap in zip(gaps, (0.4, 1.2, 3.6), strict=True)] == [True] * 3, gaps
    assert gaps[2] > gaps[0], gaps


def test_rotation_signs_with_both_secrets_during_the_grace_period(tmp_path: Path, engine_roles: Any) -> None:
    ctx = context(tmp_path)
    who = tenant_with_key(ctx, "alice", credits=100)
    with running_receiver() as rx:
        old = ctx.webhooks.add(who.tenant_id, rx.url, ["CANCELED"])
        new = ctx.webhooks.rotate(who.tenant_id, old.endpoint.id)
        assert new.secret != old.secret and new.endpoint.previous_secret_until is not None
        rx.secrets.extend([old.secret, new.secret])
        engine_roles(ctx, {"relay", "worker"})
        queued_then_cancelled(ctx, who, "k")
        wait_until(lambda: rx.count() == 1, what="delivery")
    (message,) = rx.received
    assert message.verified_by == [old.secret, new.secret]
    assert len(message.headers["webhook-signature"].split(" ")) == 2


def test_private_addresses_are_refused_without_the_setting(tmp_path: Path, engine_roles: Any) -> None:
    ctx = context(tmp_path, client_webhooks={"allow_private_networks": False})
    who = tenant_with_key(ctx, "alice", credits=100)
    with running_receiver() as rx:
        for url in (
            rx.url,
            "http://10.1.2.3/hook",
            "http://[::1]:9/x",
            "http://2130706433/x",
            "http://169.254.169.254/",
        ):
            with pytest.raises(InvalidInput, match="blocked address"):
                ctx.webhooks.add(who.tenant_id, url)
        # a name is checked when it is resolved: localhost is accepted here, and refused at delivery
        port = rx.url.split(":")[2].split("/")[0]
        ctx.webhooks.add(who.tenant_id, f"http://localhost:{port}/hook", ["CANCELED"])
        engine_roles(ctx, {"relay", "worker"})
        queued_then_cancelled(ctx, who, "k")
        wait_until(lambda: [d.state for d in deliveries(ctx)] == ["DEAD"], what="DEAD")
        assert rx.count() == 0, "nothing reached the loopback receiver"
    (delivery,) = deliveries(ctx)
    assert delivery.attempts == 1 and "blocked_address" in (delivery.last_error or "")
    assert "allow_private_networks" in (delivery.last_error or "")


def test_a_hanging_endpoint_delays_no_other_tenant_by_more_than_a_second(tmp_path: Path, engine_roles: Any) -> None:
    """Tenant A's endpoint holds every request for 30 s; tenant B's deliveries must still arrive within 1 s of the
    status change, with the default worker threads, timeout and per-endpoint limit."""
    ctx = context(tmp_path)
    a = tenant_with_key(ctx, "slow-tenant", credits=100)
    b = tenant_with_key(ctx, "other-tenant", credits=100)
    with running_receiver(script=["hang"], hang_s=30) as slow, running_receiver() as fast:
        ctx.webhooks.add(a.tenant_id, slow.url, ["CANCELED"])
        fast.secrets.append(ctx.webhooks.add(b.tenant_id, fast.url, ["CANCELED"]).secret)
        engine_roles(ctx, {"relay", "worker"})
        for i in range(6):  # more hanging deliveries than there are worker threads
            queued_then_cancelled(ctx, a, f"a{i}")
        limit = ctx.settings.client_webhooks.max_in_flight_per_endpoint
        wait_until(lambda: slow.hanging == limit, what="the slow endpoint holding its share of attempts")

        # B's changes, one after another, for longer than A's attempts take to time out (timeout_s = 10 s): the
        # bound must hold while A's attempts hang, time out, are retried and are handed back
        timeout_s = ctx.settings.client_webhooks.timeout_s
        lags: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s + 3:
            assert slow.hanging >= limit  # A's endpoint is still sitting on requests
            before = fast.count()
            started = time.time()
            queued_then_cancelled(ctx, b, f"b{len(lags)}")
            wait_until(lambda before=before: fast.count() > before, timeout_s=15, what="B's delivery")
            lags.append(fast.received[-1].at - started)
        a_rows = deliveries(ctx, tenant_id=a.tenant_id)
        # A's deliveries are neither lost nor piling up threads: waiting (handed back) or failed by the timeout
        assert len(a_rows) == 6 and {d.state for d in a_rows} <= {"PENDING", "FAILED"}
        assert any(d.state == "FAILED" and "timeout" in (d.last_error or "") for d in a_rows)
    assert all(r.verified_by for r in fast.received)
    lags.sort()
    print(f"\nB lag with A hanging: n={len(lags)} median {lags[len(lags) // 2]:.3f}s max {lags[-1]:.3f}s")
    assert max(lags) < 1.0, lags


def test_a_removed_endpoint_gets_nothing_more(tmp_path: Path, engine_roles: Any) -> None:
    ctx = context(tmp_path)
    who = tenant_with_key(ctx, "alice", credits=100)
    with running_receiver() as rx, running_receiver() as witness:
        removed = ctx.webhooks.add(who.tenant_id, rx.url, ["CANCELED"])
        kept = ctx.webhooks.add(who.tenant_id, rx.url + "?kept=1", ["SUCCEEDED"])
        seen = ctx.webhooks.add(who.tenant_id, witness.url, ["CANCELED"])
        ctx.webhooks.remove(who.tenant_id, removed.endpoint.id)
        engine_roles(ctx, {"relay", "worker"})
        queued_then_cancelled(ctx, who, "k")
        # one fan-out writes every endpoint's delivery: once the witness has its message, the others had theirs
        wait_until(lambda: witness.count() == 1, what="the witness's delivery")
    # the removed endpoint wanted CANCELED, the live one on the same receiver filters it out
    assert rx.count() == 0 and [d.endpoint_id for d in deliveries(ctx)] == [seen.endpoint.id]
    assert [v.id for v in ctx.webhooks.list_endpoints(who.tenant_id)] == [kept.endpoint.id, seen.endpoint.id]
