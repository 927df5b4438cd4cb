"""`aivedio capacity live` on databases filled by running real generations (sim provider, in-process pump, full
pipeline): the measured rates must equal what the rows say (computed here independently, in Python), the slot
limits come from the settings, and a saturated provider pool reports its queue growth."""

from __future__ import annotations

import json
from collections.abc import Callable
from statistics import mean
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import assets, task_attempts, task_state_events
from aivedio_engine.domain.capacity import CapacityInputs, estimate
from aivedio_engine.providers.sim import app as sim_app
from tests.support.seeding import Seeded

SIM_ONLY = ("default_provider=sim", "providers.sim.adapter=sim")


def live(s: Seeded, *args: str) -> dict[str, Any]:
    result = s.cli("capacity", "live", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_measured_rates_are_what_the_rows_say_and_slots_come_from_settings(seeder: Callable[..., Seeded]) -> None:
    s = seeder(
        {f"t{i}": f"scene {i}" for i in range(4)},
        cli_settings=(*SIM_ONLY, "providers.sim.max_concurrency=7", "limits.platform_max_concurrency=5"),
    )
    attempts = s.all(sa.select(task_attempts))
    w = mean((a.completed_at - a.submitted_at).total_seconds() for a in attempts)
    sizes = [a.size_bytes for a in s.all(sa.select(assets).where(assets.c.kind == "RAW_OUTPUT"))]
    e = task_state_events.c
    transitions = len(s.all(sa.select(e.id).where(e.outcome == "applied", e.from_status.is_not(None))))

    report = live(s, "--window", "1h")

    m = report["measured"]
    assert (m["arrivals"], m["finished"], m["succeeded"], m["outputs"], m["media_samples"]) == (4, 4, 4, 4, 4)
    assert m["arrival_rate"] == pytest.approx(4 / 3600)
    # SQLite's julianday() resolves ~0.1 ms: plenty for capacity planning
    assert m["provider_seconds"] == pytest.approx(w, abs=1e-3) and m["provider_samples"] == 4
    assert m["success_rate"] == 1.0
    assert m["output_bytes"] == pytest.approx(mean(sizes)) and sizes[0] == len(sim_app.sample_mp4())
    assert m["transitions_per_task"] == pytest.approx(transitions / 4)
    assert (m["in_flight"], m["backlog"]) == (0, 0)
    assert report["assumed"] == [] and report["why_no_estimate"] is None
    # the platform cap (5) binds below the provider's own limit (7)
    assert report["platform"]["slots"] == 5 and report["providers"]["sim"]["slots"] == 7
    assert report["platform"]["time_to_saturation_s"] is None and report["platform"]["queue_growth_per_min"] == 0
    inputs = CapacityInputs(
        arrival_rate=4 / 3600,
        avg_duration=m["provider_seconds"],
        provider_slots=5,
        success_rate=1.0,
        output_mb=mean(sizes) / 1e6,
        media_seconds=m["media_seconds"],
        transitions_per_task=transitions / 4,
        poll_interval=5,
        backlog=0,
    )
    assert report["figures"] == pytest.approx(estimate(inputs).figures())

    text = s.cli("capacity", "live", "--window", "1h")
    assert text.exit_code == 0 and "Provider slots" in text.stdout and "in_flight" in text.stdout


def test_a_saturated_pool_reports_queue_growth_and_no_time_left(seeder: Callable[..., Seeded]) -> None:
    s = seeder(
        {f"t{i}": f"scene {i}" for i in range(10)},
        max_concurrency=2,
        run=False,
        cli_settings=(*SIM_ONLY, "providers.sim.max_concurrency=2"),
    )
    for _ in range(3):  # two run and finish, two more take the freed slots, six wait
        s.driver.round()
    counts = s.driver.statuses()
    assert counts["SUCCEEDED"] >= 1 and counts["QUEUED"] > 0, counts

    report = live(s, "--window", "20s")

    m, sim_pool = report["measured"], report["providers"]["sim"]
    assert m["arrivals"] == 10 and m["arrival_rate"] == pytest.approx(0.5)
    assert m["in_flight"] == 2 and m["backlog"] == counts["QUEUED"] + counts["RETRY_WAIT"]
    mu = round(2 / m["provider_seconds"], 2)
    assert 0.5 > mu  # arrivals outrun what two slots can finish
    for pool in (sim_pool, report["platform"]):
        assert pool["headroom_slots"] == 0 and pool["time_to_saturation_s"] == 0.0
        assert pool["queue_growth_per_min"] == pytest.approx(round((0.5 - mu) * 60, 2))
        assert pool["queue_growth_per_min"] > 0
    assert report["figures"]["queue_growth_per_min"] == sim_pool["queue_growth_per_min"]
    text = s.cli("capacity", "live", "--window", "20s")
    assert "now" in text.stdout and "warning:" in text.stdout and "overloaded" in text.stdout


def test_an_idle_window_has_no_estimate_but_still_shows_the_slots(seeder: Callable[..., Seeded]) -> None:
    s = seeder({}, run=False, cli_settings=(*SIM_ONLY, "providers.sim.max_concurrency=3"))

    report = live(s, "--window", "15m")

    assert report["figures"] is None and report["why_no_estimate"] == "no task arrived in the window"
    assert report["platform"]["slots"] == 3 and report["platform"]["headroom_slots"] == 3
    text = s.cli("capacity", "live")
    assert text.exit_code == 0 and "no model estimate: no task arrived in the window" in text.stdout


@pytest.mark.parametrize("args", [["--window", "soon"], ["--window", "0s"], ["--target-utilization", "1.5"]])
def test_bad_options_are_usage_errors(args: list[str]) -> None:
    from typer.testing import CliRunner

    from aivedio_cli.main import app

    result = CliRunner().invoke(app, ["capacity", "live", *args])
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
