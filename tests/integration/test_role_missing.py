"""role_missing after restarts: it counts live processes only, reports the age of the role's newest heartbeat (not
that of a process that died long ago), and closes itself once a process of the role is alive again.

Processes are `HeartbeatWriter`s beating under an injected clock; a process "dies" by beating no more, and stops
cleanly with `stop()`, as `aivedio serve` does on SIGTERM. The rule runs as on every role process's heartbeat
thread (`AlertEvaluator.roles_if_due`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.tables import alerts
from aivedio_engine.services.liveness import REQUIRED_ROLES, HeartbeatWriter
from tests.support.app import FakeClock, make_context, tenant_with_key

ROLES = frozenset(REQUIRED_ROLES)
MISSING_S = 60
THRESHOLDS = {"interval_s": 1, "role_missing_s": MISSING_S}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx(tmp_path: Path, pg_url: str, clock: FakeClock) -> Iterator[AppContext]:
    context = make_context(
        tmp_path / "data", pg_url, clock=clock, alerts={"interval_s": 1, "role_missing_s": MISSING_S}
    )
    try:
        who = tenant_with_key(context, "t")  # work waiting for every role: the rule only speaks then
        context.generations.create(who.tenant_id, "k1", {"prompt": "a fox", "model": "local-v1", "duration_s": 2})
        yield context
    finally:
        context.close()


def process(ctx: AppContext, clock: FakeClock) -> HeartbeatWriter:
    writer = HeartbeatWriter(ctx.engine, clock, ctx.settings, ROLES)
    writer.beat()
    return writer


def evaluate(ctx: AppContext, clock: FakeClock) -> None:
    clock.advance(1)  # past alerts.interval_s since the last evaluation
    ctx.alert_evaluator.roles_if_due()


def role_alerts(ctx: AppContext) -> list[Any]:
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    alerts.c.subject_id, alerts.c.status, alerts.c.message, alerts.c.details, alerts.c.resolved_at
                )
                .where(alerts.c.rule == Rule.ROLE_MISSING.value)
                .order_by(alerts.c.raised_at, alerts.c.subject_id)
            )
        )


def test_a_dead_process_beside_a_live_one_is_no_missing_role(ctx: AppContext, clock: FakeClock) -> None:
    process(ctx, clock)  # killed: it never beats again, and never says it stopped
    clock.advance(1800)
    process(ctx, clock)  # its replacement
    evaluate(ctx, clock)
    assert role_alerts(ctx) == []


def test_the_alert_gives_the_age_of_the_roles_newest_heartbeat(ctx: AppContext, clock: FakeClock) -> None:
    process(ctx, clock)  # killed long ago
    clock.advance(1800)
    restarted = process(ctx, clock)
    clock.advance(40)
    restarted.stop()  # a full restart: every process stops cleanly ...
    clock.advance(10)
    evaluate(ctx, clock)  # ... and the first to come back evaluates before the others are up
    assert role_alerts(ctx) == []  # within role_missing_s of the last heartbeat: a restart, not an outage
    clock.advance(300)  # ... but nobody comes back
    evaluate(ctx, clock)
    found = role_alerts(ctx)
    assert sorted(a.subject_id for a in found) == sorted(REQUIRED_ROLES)
    for a in found:
        # the stop 312 s ago, not the killed process's last beat 2152 s ago
        assert a.details["last_seen_age_s"] == pytest.approx(312), a
        assert "the last one stopped 312 s ago" in a.message, a.message


def test_the_alert_closes_itself_when_the_role_is_back(ctx: AppContext, clock: FakeClock) -> None:
    process(ctx, clock)  # killed
    clock.advance(MISSING_S + 30)
    evaluate(ctx, clock)
    assert {(a.subject_id, a.status) for a in role_alerts(ctx)} == {(r, "OPEN") for r in REQUIRED_ROLES}

    back = process(ctx, clock)
    evaluate(ctx, clock)
    closed = role_alerts(ctx)
    assert {(a.subject_id, a.status) for a in closed} == {(r, "RESOLVED") for r in REQUIRED_ROLES}
    assert all(a.resolved_at == clock.now() for a in closed)

    clock.advance(MISSING_S + 30)  # it dies again: a new alert, the resolved one stays as it was
    evaluate(ctx, clock)
    again = role_alerts(ctx)
    assert sorted((a.subject_id, a.status) for a in again) == sorted(
        [(r, "RESOLVED") for r in REQUIRED_ROLES] + [(r, "OPEN") for r in REQUIRED_ROLES]
    )
    back.beat()
    evaluate(ctx, clock)
    assert {a.status for a in role_alerts(ctx)} == {"RESOLVED"}
