"""Running many generations against the sim provider, in-process, with both clocks under test control."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.session import write_tx
from aivedio_engine.db.tables import generation_tasks, outbox_events, task_attempts
from aivedio_engine.domain.events import EventType
from tests.support.app import FakeClock, make_context, tenant_with_key
from tests.support.pump import Pump
from tests.support.sim import SimHandle, wait_until


def sim_context(
    tmp_path: Path,
    sim: SimHandle,
    database_url: str | None = None,
    *,
    max_concurrency: int = 50,
    provider: dict[str, Any] | None = None,
    **overrides: Any,
) -> AppContext:
    settings = sim.provider_settings(max_concurrency=max_concurrency, **(provider or {}))
    overrides.setdefault("polling", {"min_interval_s": 5, "max_interval_s": 10, "jitter": 0.2})
    overrides.setdefault("limits", {"platform_max_concurrency": 1000, "tenant_default_max_concurrency": 1000})
    # these tests drive and count each step's message; the fetch → media step without a hop has its own
    # (tests/flow/test_inline_media.py), which turn it back on
    overrides["media"] = {"inline_after_fetch_max_bytes": 0, **overrides.get("media", {})}
    return make_context(
        tmp_path / "data",
        database_url,
        clock=FakeClock(),
        providers={"sim": settings},
        default_provider="sim",
        **overrides,
    )


def create_tasks(ctx: AppContext, n: int, *, credits: int = 100_000, prefix: str = "t") -> list[Any]:
    who = tenant_with_key(ctx, f"tenant-{prefix}", credits=credits)
    return [
        ctx.generations.create(
            who.tenant_id, f"{prefix}{i}", {"prompt": f"scene {i}", "model": "sim-v1", "duration_s": 2}
        ).task.id
        for i in range(n)
    ]


@dataclass
class Driver:
    ctx: AppContext
    sim: SimHandle
    pump: Pump
    step_s: float = 6.0
    #: the sim sends real webhooks (to a running API): each round waits until they are all delivered
    callbacks: bool = False

    def round(self) -> None:
        self.ctx.dispatcher.run_once(max_picks=200)
        self.pump.run()
        self.ctx.sweeper.sweep()
        self.pump.run()
        self.ctx.clock.advance(self.step_s)  # type: ignore[attr-defined]
        self.sim.advance(self.step_s)
        if self.callbacks:
            wait_until(
                lambda: self.sim.truth()["callbacks"]["pending"] == 0, timeout_s=30, what="sim callbacks delivered"
            )

    def run_until(self, done: Any, max_rounds: int = 200) -> int:
        for i in range(max_rounds):
            if done():
                return i
            self.round()
        raise AssertionError(f"not done after {max_rounds} rounds: {self.statuses()}")

    def statuses(self) -> Counter[str]:
        with self.ctx.engine.connect() as conn:
            return Counter(r[0] for r in conn.execute(sa.select(generation_tasks.c.status)))

    def all_in(self, *states: str) -> bool:
        counts = self.statuses()
        return sum(counts[s] for s in states) == sum(counts.values())

    def attempts_per_task(self) -> Counter[int]:
        with self.ctx.engine.connect() as conn:
            per = Counter(r[0] for r in conn.execute(sa.select(task_attempts.c.task_id)))
        return Counter(per.values())


def lose_messages(ctx: AppContext, event_type: EventType) -> int:
    """What a flushed broker does to the messages of one type already handed to it: the rows say they went out,
    and nobody will ever consume them. Returns how many were lost."""
    o = outbox_events.c
    with write_tx(ctx.engine) as conn:
        return conn.execute(
            outbox_events.update()
            .where(o.event_type == event_type.value, o.status == "PENDING")
            .values(status="PUBLISHED", published_at=ctx.clock.now())
        ).rowcount
