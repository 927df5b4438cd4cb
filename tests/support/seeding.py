"""A database filled by running real generations (sim provider, in-process Pump, full pipeline through output
fetch and media), and a CLI runner pointed at it.

The CLI builds its own context with the system clock; the seeded rows carry the test's FakeClock times (which run
ahead of the wall clock as rounds advance it). `Seeded` patches `SystemClock.now` to read the same FakeClock, so
the CLI and the engine agree on "now" and a test can let claims expire by advancing it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner, Result

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import SystemClock
from aivedio_engine.db import balances
from aivedio_engine.db.tables import audit_log, credit_ledger, generation_tasks, review_items
from tests.support.app import tenant_with_key
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle

REVIEW_TERM = "fox"
SETTLED = ("SUCCEEDED", "FAILED_FINAL", "CANCELED", "EXPIRED", "MANUAL_REVIEW")
runner = CliRunner()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """None: embedded SQLite in the data dir; else a throwaway PostgreSQL database."""
    return None if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


@dataclass
class Seeded:
    ctx: AppContext
    sim: SimHandle
    driver: Driver
    data_dir: Path
    database_url: str | None
    tenant_id: uuid.UUID
    tasks: dict[str, uuid.UUID] = field(default_factory=dict)
    cli_settings: tuple[str, ...] = ()

    def cli(self, *args: str, input: str | None = None) -> Result:
        sets = [f"data_dir={self.data_dir}", *self.cli_settings]
        if self.database_url:
            sets.append(f"database.url={self.database_url}")
        return runner.invoke(app, [a for s in sets for a in ("--set", s)] + list(args), input=input)

    def create(self, name: str, prompt: str) -> uuid.UUID:
        self.tasks[name] = self.ctx.generations.create(
            self.tenant_id, name, {"prompt": prompt, "model": "sim-v1", "duration_s": 2}
        ).task.id
        return self.tasks[name]

    def run(self, max_rounds: int = 40) -> None:
        """Drive every task to a terminal state or MANUAL_REVIEW."""
        self.driver.run_until(lambda: self.driver.all_in(*SETTLED), max_rounds=max_rounds)

    def advance(self, seconds: float) -> None:
        self.ctx.clock.advance(seconds)  # type: ignore[attr-defined]
        self.sim.advance(seconds)

    def task(self, name: str) -> Any:
        return self.one(sa.select(generation_tasks).where(generation_tasks.c.id == self.tasks[name]))

    def one(self, stmt: Any) -> Any:
        with self.ctx.engine.connect() as conn:
            return conn.execute(stmt).one()

    def all(self, stmt: Any) -> list[Any]:
        with self.ctx.engine.connect() as conn:
            return list(conn.execute(stmt))

    def execute(self, stmt: Any, **params: Any) -> None:
        """A targeted corruption (tests prove a check fires by breaking exactly what it guards): a Core statement,
        or SQL text for DDL."""
        with self.ctx.engine.begin() as conn:
            conn.execute(sa.text(stmt) if isinstance(stmt, str) else stmt, params)

    def review_item(self, name: str) -> Any:
        return self.one(sa.select(review_items).where(review_items.c.task_id == self.tasks[name]))

    def ledger(self, name: str) -> list[tuple[str, Any]]:
        rows = self.all(
            sa.select(credit_ledger.c.entry_type, credit_ledger.c.amount)
            .where(credit_ledger.c.task_id == self.tasks[name])
            .order_by(credit_ledger.c.created_at, credit_ledger.c.id)
        )
        return [(r.entry_type, r.amount) for r in rows]

    def balance(self) -> Any:
        return self.one(sa.select(balances.total_of(self.tenant_id)))[0]

    def audit_rows(self, command: str) -> list[Any]:
        return self.all(sa.select(audit_log).where(audit_log.c.command == command).order_by(audit_log.c.created_at))


def seed(
    tmp_path: Path,
    sim: SimHandle,
    database_url: str | None,
    monkeypatch: pytest.MonkeyPatch,
    prompts: dict[str, str],
    *,
    max_concurrency: int = 50,
    duplicate_every: int = 0,
    cli_settings: Iterable[str] = (),
    run: bool = True,
    provider: dict[str, Any] | None = None,
) -> Seeded:
    """A tenant with 1000 credits and one task per prompt, run through the whole pipeline (unless run=False);
    prompts mentioning REVIEW_TERM end in MANUAL_REVIEW with a review item. `provider`: the sim provider's settings
    (e.g. its models)."""
    ctx = sim_context(
        tmp_path,
        sim,
        database_url,
        max_concurrency=max_concurrency,
        provider=provider,
        media={"review_prompt_terms": [REVIEW_TERM]},
    )
    clock = ctx.clock
    monkeypatch.setattr(SystemClock, "now", lambda self: clock.now())
    who = tenant_with_key(ctx, "acme", credits=1000)
    seeded = Seeded(
        ctx,
        sim,
        Driver(ctx, sim, Pump(ctx, duplicate_every=duplicate_every)),
        tmp_path / "data",
        database_url,
        who.tenant_id,
        cli_settings=tuple(cli_settings),
    )
    for name, prompt in prompts.items():
        seeded.create(name, prompt)
    if run:
        seeded.run()
    return seeded


@pytest.fixture
def seeder(
    tmp_path: Path, sim: SimHandle, database_url: str | None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Seeded]]:
    """`seeder(prompts, **seed_options)` → Seeded on the test's database; contexts are closed afterwards (before
    the PostgreSQL database is dropped)."""
    made: list[Seeded] = []

    def make(prompts: dict[str, str], **options: Any) -> Seeded:
        made.append(seed(tmp_path, sim, database_url, monkeypatch, prompts, **options))
        return made[-1]

    yield make
    for s in made:
        s.ctx.close()
