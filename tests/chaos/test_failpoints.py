"""The failpoint harness: spec parsing, deterministic firing, and the hit log surviving a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointCrash, FailpointError, failpoint


@pytest.fixture(autouse=True)
def _disarm() -> Iterator[None]:
    failpoints.reset()
    yield
    failpoints.reset()


def test_unarmed_failpoints_do_nothing() -> None:
    failpoint("relay.after_enqueue")
    assert failpoints.hits("relay.after_enqueue") == 0


def test_raise_on_the_nth_hit_only() -> None:
    failpoints.configure("x=raise@3")
    failpoint("x")
    failpoint("x")
    with pytest.raises(FailpointError, match="x fired \\(hit 3\\)"):
        failpoint("x")
    failpoint("x")
    assert failpoints.hits("x") == 4


def test_a_crash_is_not_an_exception_so_no_handler_swallows_it_and_the_transaction_rolls_back(pg_url: str) -> None:
    import sqlalchemy as sa

    failpoints.configure("c.before_commit=crash@1")
    engine = sa.create_engine(pg_url)
    try:
        with pytest.raises(FailpointCrash, match="c.before_commit crashed"), engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE crash_probe (x int)"))
            try:
                failpoint("c.before_commit")
            except Exception:  # noqa: BLE001 - what the engine's broad handlers do: it must not stop a crash
                pytest.fail("an except Exception caught the crash")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT to_regclass('crash_probe')")).scalar() is None
    finally:
        engine.dispose()


def test_probability_is_deterministic_for_a_seed() -> None:
    def pattern(seed: int) -> list[bool]:
        failpoints.configure("p=raise%0.3", seed=seed)
        fired = []
        for _ in range(200):
            try:
                failpoint("p")
                fired.append(False)
            except FailpointError:
                fired.append(True)
        return fired

    first = pattern(7)
    assert first == pattern(7)
    assert first != pattern(8)
    assert 30 < sum(first) < 90


def test_several_entries_and_in_process_callbacks() -> None:
    failpoints.configure("a=count; b=sleep:0")
    seen: list[int] = []
    failpoints.enable("c", lambda: seen.append(1))
    for name in ("a", "a", "b", "c"):
        failpoint(name)
    assert (failpoints.hits("a"), failpoints.hits("b"), seen) == (2, 1, [1])


@pytest.mark.parametrize("spec", ["noequals", "x=explode", "x=raise@0", "x=raise%1.5", "=raise"])
def test_bad_specs_are_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="failpoint entry"):
        failpoints.parse(spec)


def test_kill_counts_the_hit_before_the_process_dies(tmp_path: Path) -> None:
    log = tmp_path / "hits.log"
    env = {**os.environ, "AIVEDIO_FAILPOINTS": "k=kill@3", "AIVEDIO_FAILPOINTS_LOG": str(log)}
    code = (
        "from aivedio_engine.testing.failpoints import failpoint\nfor _ in range(10): failpoint('k')\nprint('survived')"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == -signal.SIGKILL and "survived" not in result.stdout
    lines = log.read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["k", "1"], ["k", "2"], ["k", "3"]]
