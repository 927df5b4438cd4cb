"""The judges of the degradation matrix's `fetch_pressure` and `media` rows on made-up observations: each passes
what the product should do and fails what it should not (a lowered limit exceeded, never binding, never lifted; a
task failed or succeeded with the media worker gone, a raw output not kept, a wrong stage shown).

Nothing here starts a process or needs a database; `bench/run degrade --row ...` runs the rows for real."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from bench.degrade import media_row, pressure_row
from bench.degrade.matrix import ROWS
from bench.degrade.rows import Outage

CAP = pressure_row.lowered_limit()


def _outage(samples: list[dict[str, Any]], recovery: list[dict[str, Any]] | None = None, **extra: Any) -> Outage:
    o = Outage(system=extra.pop("system", None), load=None, db=extra.pop("db", None))  # type: ignore[arg-type]
    o.t_cut, o.t_restore = 1000.0, 1030.0
    o.samples, o.recovery_samples = samples, recovery or []
    o.notes.update(extra)
    return o


def _pressed(t: float, in_flight: int, queued: int = 5, urgent: int = 3) -> dict[str, Any]:
    return {"t": t, "urgent": urgent, "in_flight": in_flight, "QUEUED": queued, "OUTPUT_FETCHING": urgent}


def test_the_new_rows_are_selectable() -> None:
    assert {"media", "fetch_pressure"} <= set(ROWS)
    assert ROWS["fetch_pressure"].dependency == "storage" and ROWS["media"].dependency == "media"
    assert CAP == 4  # platform limit 8 × the product's default pressure_dispatch_fraction 0.5
    # the rows that judge fetched tasks cut only once a task has gone all the way (a slow warm-up fetched nothing)
    assert {n for n, r in ROWS.items() if r.ready is not None} == {"storage", "dns", "media", "fetch_pressure"}


def test_pressure_passes_when_the_lowered_limit_held_and_came_back() -> None:
    during = [_pressed(0, 8), *(_pressed(t, CAP) for t in range(10, 30))]
    after = [_pressed(31, CAP), {**_pressed(40, 8, queued=6, urgent=0)}]
    o = _outage(during, after)
    assert pressure_row._judge(o) == []
    assert o.notes["max_in_flight_under_pressure"] == CAP and o.notes["max_in_flight_after_lift"] == 8
    assert o.notes["pressure_lifted_after_restore_s"] == 10.0


def test_pressure_fails_above_the_lowered_limit_or_when_it_never_bound() -> None:
    over = _outage([_pressed(t, CAP + 1) for t in range(10, 30)])
    assert any("above the lowered" in f for f in pressure_row._judge(over))
    idle = _outage([_pressed(t, 2, queued=0) for t in range(10, 30)])
    assert any("never held QUEUED tasks back" in f for f in pressure_row._judge(idle))
    none = _outage([_pressed(t, 8, urgent=0) for t in range(0, 30)])
    assert any("pressure never began" in f for f in pressure_row._judge(none))


def test_pressure_fails_when_the_limit_stays_low_after_it_lifted() -> None:
    o = _outage([_pressed(t, CAP) for t in range(10, 30)], [_pressed(t, CAP, queued=9, urgent=0) for t in (35, 40)])
    assert any("pressure lifted" in f for f in pressure_row._judge(o))


def test_pressure_fails_a_failed_task() -> None:
    o = _outage([{**_pressed(t, CAP), "FAILED_FINAL": int(t == 20)} for t in range(10, 30)])
    assert any("failed or retry-waited" in f for f in pressure_row._judge(o))


def _media(samples: list[dict[str, Any]], final: dict[str, int], **notes: Any) -> Outage:
    db = SimpleNamespace(statuses=lambda: Counter(final))
    base = {"_stages": ["POST_PROCESSING:generated, processing"] * 3, "_raw_checked": {"a", "b"}}
    return _outage(samples, system=SimpleNamespace(media_restarts=1), db=db, **{**base, **notes})


def _waiting(n: int, ok: int = 2, raw_missing: int = 0) -> dict[str, Any]:
    return {"POST_PROCESSING": n, "SUCCEEDED": ok, "raw_missing": raw_missing}


def test_media_passes_when_tasks_waited_kept_and_all_succeeded_after() -> None:
    o = _media([_waiting(3), _waiting(9)], {"SUCCEEDED": 20})
    assert media_row._judge(o) == []
    assert o.notes["max_post_processing"] == 9 and o.notes["stage_generated_processing"] == 3


def test_media_fails_what_the_seed_forbids() -> None:
    def failures(o: Outage) -> str:
        return " | ".join(media_row._judge(o))

    assert "SUCCEEDED while no media worker ran" in failures(_media([_waiting(3), _waiting(4, ok=3)], {"SUCCEEDED": 9}))
    assert "without a kept RAW_OUTPUT" in failures(_media([_waiting(3, raw_missing=1)], {"SUCCEEDED": 9}))
    assert "not in the bucket" in failures(_media([_waiting(3)], {"SUCCEEDED": 9}, _raw_not_stored=["t1"]))
    assert "the API showed" in failures(_media([_waiting(3)], {"SUCCEEDED": 9}, _stages=["POST_PROCESSING:done"]))
    assert "not every task SUCCEEDED" in failures(_media([_waiting(3)], {"SUCCEEDED": 8, "FAILED_FINAL": 1}))
    assert "no task waited" in failures(_media([_waiting(0)], {"SUCCEEDED": 9}))
    assert "failed or retry-waited" in failures(_media([{**_waiting(3), "RETRY_WAIT": 1}], {"SUCCEEDED": 9}))
