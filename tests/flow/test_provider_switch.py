"""A task moves to the next provider offering its model when its own is failing (domain/provider_switch.py),
through the real dispatcher, submit step and sweeper, against two simulated vendors."""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import generation_tasks, task_attempts
from tests.support.app import FakeClock, make_context, tenant_with_key
from tests.support.pump import Pump
from tests.support.sim import SimHandle, running_sim


def _context(tmp_path: Path, a: SimHandle, b: SimHandle, **overrides: Any) -> AppContext:
    overrides.setdefault("retry", {"submit": {"max_attempts": 10, "base_delay_s": 1, "max_delay_s": 1}})
    return make_context(
        tmp_path / "data",
        clock=FakeClock(),
        providers={"a": a.provider_settings(max_concurrency=20), "b": b.provider_settings(max_concurrency=20)},
        default_provider="a",
        polling={"min_interval_s": 5, "max_interval_s": 10, "jitter": 0.2},
        limits={"platform_max_concurrency": 1000, "tenant_default_max_concurrency": 1000},
        **overrides,
    )


def _round(ctx: AppContext, pump: Pump, sims: tuple[SimHandle, ...], step_s: float = 2) -> None:
    ctx.dispatcher.run_once(max_picks=200)
    pump.run()
    ctx.sweeper.sweep()
    pump.run()
    ctx.clock.advance(step_s)  # type: ignore[attr-defined]
    for sim in sims:
        sim.advance(step_s)


def _create(ctx: AppContext, tenant: Any, n: int, prefix: str, **extra: Any) -> list[Any]:
    body = {"model": "sim-v1", "duration_s": 2, **extra}
    return [
        ctx.generations.create(tenant, f"{prefix}{i}", {"prompt": f"{prefix} {i}", **body}).task.id for i in range(n)
    ]


def _where(ctx: AppContext, ids: list[Any]) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(task statuses, tasks' selected providers, providers of their attempts)"""
    with ctx.engine.connect() as conn:
        tasks = conn.execute(
            sa.select(generation_tasks.c.status, generation_tasks.c.selected_provider).where(
                generation_tasks.c.id.in_(ids)
            )
        ).all()
        attempts = conn.execute(sa.select(task_attempts.c.provider).where(task_attempts.c.task_id.in_(ids))).all()
    return (
        Counter(t.status for t in tasks),
        Counter(t.selected_provider for t in tasks),
        Counter(a[0] for a in attempts),
    )


def test_with_the_first_providers_breaker_open_new_tasks_go_to_the_second(tmp_path: Path) -> None:
    with ExitStack() as stack:
        a = stack.enter_context(running_sim(seed=61, faults="5xx=1", job_seconds=2))
        b = stack.enter_context(running_sim(seed=62, job_seconds=2))
        ctx = _context(tmp_path, a, b)
        stack.callback(ctx.close)
        tenant = tenant_with_key(ctx, "switcher", credits=100_000).tenant_id
        pump = Pump(ctx, stop_at_fetch=True)
        # tasks that named provider a fail there and open its breaker; being pinned, none of them moves
        pinned = _create(ctx, tenant, 6, "pinned", provider="a")
        _round(ctx, pump, (a, b))
        assert a.truth()["calls"]["submit"] == 6
        a.set_faults("")  # a is healthy again, but its breaker stays open for 30 s: nothing more is sent to it
        sent_to_a = a.truth()["calls"]["submit"]

        moving = _create(ctx, tenant, 4, "free")  # no provider named: a by default, b allowed
        for _ in range(5):  # 10 s, well inside a's open window
            _round(ctx, pump, (a, b))

        statuses, selected, attempts = _where(ctx, moving)
        assert a.truth()["calls"]["submit"] == sent_to_a  # not one submit reached a while its breaker was open
        assert attempts == Counter({"b": 4}) and selected == Counter({"b": 4})
        assert statuses == Counter({"OUTPUT_FETCHING": 4}), statuses
        assert len(b.truth()["jobs"]) == 4
        _, pinned_selected, pinned_attempts = _where(ctx, pinned)
        assert pinned_selected == Counter({"a": 6}) and set(pinned_attempts) == {"a"}


def test_a_provider_side_rejection_moves_the_retry_at_once_but_a_pinned_task_waits(tmp_path: Path) -> None:
    with ExitStack() as stack:
        a = stack.enter_context(running_sim(seed=63, faults="5xx=1", job_seconds=2))
        b = stack.enter_context(running_sim(seed=64, job_seconds=2))
        ctx = _context(tmp_path, a, b, retry={"submit": {"base_delay_s": 600, "max_delay_s": 600}})
        stack.callback(ctx.close)
        tenant = tenant_with_key(ctx, "rejected", credits=100_000).tenant_id
        pump = Pump(ctx, stop_at_fetch=True)
        free = _create(ctx, tenant, 1, "free")
        pinned = _create(ctx, tenant, 1, "pinned", provider="a")
        for _ in range(8):  # 16 s: the move, the submit at b, its first polls
            _round(ctx, pump, (a, b))
        statuses, selected, attempts = _where(ctx, free)
        assert attempts == Counter({"a": 1, "b": 1}) and selected == Counter({"b": 1})
        assert statuses == Counter({"OUTPUT_FETCHING": 1}), statuses
        statuses, selected, attempts = _where(ctx, pinned)
        # full jitter may bring its retry early, but every one of them goes to a again
        assert set(attempts) == {"a"} and selected == Counter({"a": 1})
        assert statuses == Counter({"RETRY_WAIT": 1}), statuses


def test_no_switch_when_the_submit_budget_forbids_it(tmp_path: Path) -> None:
    with ExitStack() as stack:
        a = stack.enter_context(running_sim(seed=65, faults="5xx=1", job_seconds=2))
        b = stack.enter_context(running_sim(seed=66, job_seconds=2))
        retry = {"submit": {"base_delay_s": 600, "max_delay_s": 600, "provider_switch_allowed": False}}
        ctx = _context(tmp_path, a, b, retry=retry)
        stack.callback(ctx.close)
        tenant = tenant_with_key(ctx, "stays", credits=100_000).tenant_id
        free = _create(ctx, tenant, 1, "free")
        pump = Pump(ctx, stop_at_fetch=True)
        for _ in range(3):
            _round(ctx, pump, (a, b))
        statuses, selected, attempts = _where(ctx, free)
        assert set(attempts) == {"a"} and selected == Counter({"a": 1}) and statuses == Counter({"RETRY_WAIT": 1})
        assert b.truth()["calls"]["submit"] == 0


def test_the_facts_of_a_switch_pinning_and_an_unreconciled_attempt(tmp_path: Path) -> None:
    from aivedio_engine.db import switching

    ctx = make_context(tmp_path / "data", clock=FakeClock())
    try:
        tenant = tenant_with_key(ctx, "facts", credits=100).tenant_id
        free = ctx.generations.create(tenant, "f", {"prompt": "p", "model": "local-v1", "duration_s": 2}).task.id
        named = ctx.generations.create(
            tenant, "n", {"prompt": "p", "model": "local-v1", "duration_s": 2, "provider": "local"}
        ).task.id
        with ctx.engine.connect() as conn:
            facts = switching.facts(conn, [free, named])
        assert facts[free].params["provider_pinned"] is False and facts[named].params["provider_pinned"] is True
        assert facts[free].reserved == Decimal("1")  # 2 s at 360p, 0.5 per s and not facts[free].ambiguous_unresolved
        assert ctx.dispatcher.run_once() == 2
        for state, unresolved in (("SENDING", True), ("UNKNOWN", True), ("FAILED_BEFORE_ACCEPT", False)):
            with ctx.engine.begin() as conn:
                conn.execute(task_attempts.update().where(task_attempts.c.task_id == free).values(submit_state=state))
            with ctx.engine.connect() as conn:
                assert switching.facts(conn, [free])[free].ambiguous_unresolved is unresolved, state
    finally:
        ctx.close()
