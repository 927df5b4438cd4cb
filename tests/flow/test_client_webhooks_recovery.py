"""Client webhook deliveries survive a worker that dies mid-attempt and an endpoint removed under them. Driven
deterministically (outbox rows handed to the actors in order, the engine's clock under test control) against a
real loopback receiver that verifies the signatures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointError
from tests.support.app import FakeClock, TenantKey, make_context, tenant_with_key
from tests.support.pump import Pump
from tests.support.webhook_receiver import running_receiver


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AppContext]:
    failpoints.reset()
    context = make_context(tmp_path / "data", clock=FakeClock(), client_webhooks={"allow_private_networks": True})
    yield context
    failpoints.reset()
    context.close()


def cancel(ctx: AppContext, who: TenantKey, key: str) -> None:
    task = ctx.generations.create(who.tenant_id, key, {"prompt": "x", "model": "local-v1", "duration_s": 2}).task
    ctx.generations.cancel(who.tenant_id, task.id)


def test_an_attempt_cut_short_after_its_claim_is_retried_by_its_watchdog(ctx: AppContext) -> None:
    who = tenant_with_key(ctx, "alice")
    pump = Pump(ctx)
    with running_receiver() as rx:
        rx.secrets.append(ctx.webhooks.add(who.tenant_id, rx.url, ["CANCELED"]).secret)
        cancel(ctx, who, "k")
        failpoints.configure("webhooks.after_claim=raise@1")
        with pytest.raises(FailpointError):
            pump.run()  # the worker "dies" between its claim and the HTTP call
        (claimed,) = ctx.webhooks.deliveries()
        assert (claimed.state, claimed.attempts, rx.count()) == ("PENDING", 0, 0)

        pump.run()
        assert rx.count() == 0, "a redelivered message finds the claim still held: no second sender"
        hold_s = ctx.settings.client_webhooks.timeout_s + 5
        ctx.clock.advance(hold_s + 1)  # type: ignore[attr-defined]
        pump.run()
        (done,) = ctx.webhooks.deliveries()
    assert (done.state, done.attempts, done.last_status_code) == ("DELIVERED", 1, 200)
    assert rx.count() == 1 and rx.received[0].verified_by


def test_deliveries_of_a_removed_endpoint_die_and_are_not_replayed(ctx: AppContext) -> None:
    from aivedio_engine.services.operations import Operation

    who = tenant_with_key(ctx, "alice")
    pump = Pump(ctx)
    with running_receiver(script=[500]) as rx:
        endpoint = ctx.webhooks.add(who.tenant_id, rx.url, ["CANCELED"]).endpoint
        cancel(ctx, who, "k")
        pump.run()
        (failed,) = ctx.webhooks.deliveries()
        assert (failed.state, failed.attempts, failed.last_status_code) == ("FAILED", 1, 500)
        ctx.webhooks.remove(who.tenant_id, endpoint.id)
        ctx.clock.advance(3600)  # type: ignore[attr-defined]
        pump.run()
        (dead,) = ctx.webhooks.deliveries()
        assert (dead.state, dead.attempts, dead.last_error) == ("DEAD", 1, "endpoint removed")
        result = ctx.webhooks.replay([dead.id], Operation("replay webhooks", "try", dry_run=False))
    assert result == {"done": [], "skipped": [{"id": str(dead.id), "reason": "its endpoint was removed"}]}
    assert rx.count() == 1
