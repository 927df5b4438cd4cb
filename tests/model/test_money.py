"""The money checker (tests/model/money.py) at CI size: a fixed seed, 50 sequences of at most 20 steps, on embedded
SQLite and on PostgreSQL; each prints how many sequences and steps it ran and how long they took. The long run is
`python -m tests.model.money --sequences 1000` (docs/development.md)."""

from __future__ import annotations

import time

import pytest

from tests.model import engine, money

#: fixed so that CI runs the same sequences every time; a failure names its steps, and this seed replays them
CI_SEED = 2029
SEQUENCES = 50
STEPS = 20


def _run(capsys: pytest.CaptureFixture[str], database: object, backend: str) -> None:
    before = engine.Counts.sequences, engine.Counts.steps
    started = time.monotonic()
    money.run(database, sequences=SEQUENCES, steps=STEPS, seed_value=CI_SEED)  # type: ignore[arg-type]
    sequences, steps = engine.Counts.sequences - before[0], engine.Counts.steps - before[1]
    with capsys.disabled():
        print(
            f"\nmoney checker on {backend}: {sequences} sequences, {steps} steps in "
            f"{time.monotonic() - started:.0f} s (seed {CI_SEED})"
        )
    assert sequences >= SEQUENCES


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_money_holds_on_sqlite(capsys: pytest.CaptureFixture[str]) -> None:
    _run(capsys, engine.sqlite_database, "sqlite")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_money_holds_on_postgres(capsys: pytest.CaptureFixture[str], pg_template: str) -> None:
    _run(capsys, engine.postgres_database(pg_template), "postgresql")
