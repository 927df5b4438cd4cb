"""The pure half of `capacity live` (domain/capacity_live.py): window parsing, slot pressure and time to
saturation, and how measurements become inputs model."""

from __future__ import annotations

import math

import pytest

from aivedio_engine.domain.capacity import CapacityInputs, estimate
from aivedio_engine.domain.capacity_live import (
    MAX_WINDOW_S,
    Measured,
    SlotLimits,
    assess,
    fmt_duration,
    live_inputs,
    parse_window,
    pressure_warnings,
    saturation,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("2d", 172_800),
        ("30", 30),
        ("1.5h", 5400),
        (" 10m ", 600),
        ("1w", 604_800),  # the one duration syntax of the CLI (domain/durations.py)
    ],
)
def test_windows_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5w", "-1h", "0s", "31d", "1h30m"])
def test_bad_windows_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="window must"):
        parse_window(text)
    assert MAX_WINDOW_S == 30 * 86400


def integrate_to_saturation(lam: float, w: float, slots: int, x0: float, dt: float = 0.001) -> float:
    """dx/dt = λ − x/W stepped numerically, independent of the closed form under test."""
    x, t = x0, 0.0
    while x < slots:
        x += (lam - x / w) * dt
        t += dt
    return t


def test_seed_numbers_saturate_400_slots_in_about_four_minutes_then_grow_like_the_model() -> None:
    s = saturation(3, 180, 400, in_flight=0)

    assert s.utilization == 1.35 and s.headroom_slots == 400
    assert s.time_to_saturation_s == pytest.approx(180 * math.log(540 / 140), abs=0.05)
    assert s.time_to_saturation_s == pytest.approx(integrate_to_saturation(3, 180, 400, 0), rel=1e-3)
    # the same growth the seed prints (46.8 with μ reported as 2.22), not 46.67
    assert s.queue_growth_per_min == 46.8 == estimate(CapacityInputs(3, 180, provider_slots=400)).queue_growth_per_min
    assert s.headroom_rate == pytest.approx(0.75 * 400 / 180 - 3, abs=1e-4)


@pytest.mark.parametrize(("lam", "w", "slots", "x0"), [(0.5, 6, 2, 1), (2, 30, 50, 10), (0.1, 100, 5, 0)])
def test_time_to_saturation_matches_a_numerical_integration(lam: float, w: float, slots: int, x0: int) -> None:
    s = saturation(lam, w, slots, x0)
    assert s.time_to_saturation_s == pytest.approx(integrate_to_saturation(lam, w, slots, x0), rel=2e-3, abs=0.05)


def test_a_pool_that_keeps_up_never_saturates() -> None:
    s = saturation(1, 10, 20, in_flight=12)
    assert (s.time_to_saturation_s, s.queue_growth_per_min, s.utilization, s.headroom_slots) == (None, 0.0, 0.5, 8)
    assert s.headroom_rate == pytest.approx(0.5)


def test_a_full_pool_is_saturated_now_even_when_the_rates_are_unknown() -> None:
    assert saturation(3, 180, 400, in_flight=400).time_to_saturation_s == 0.0
    unknown = saturation(0.2, None, 4, in_flight=4)
    assert (unknown.time_to_saturation_s, unknown.utilization, unknown.headroom_slots) == (0.0, None, 0)
    assert saturation(0.2, None, 4, in_flight=1).time_to_saturation_s is None
    no_limit = saturation(0.2, 5, None, in_flight=9)
    assert (no_limit.slots, no_limit.headroom_slots, no_limit.time_to_saturation_s) == (None, None, None)


def test_growth_always_agrees_with_the_models_queue_growth() -> None:
    for lam, w, c in [(3, 180, 400), (0.5, 6, 2), (10, 45, 300), (1.001, 1, 1), (0.3, 7, 2)]:
        assert (
            saturation(lam, w, c, 0).queue_growth_per_min
            == estimate(CapacityInputs(lam, w, provider_slots=c)).queue_growth_per_min
        )


def test_platform_slots_are_the_providers_sum_capped_by_the_platform_limit() -> None:
    assert SlotLimits({"a": 4, "b": 6}, platform=64).total == 10
    assert SlotLimits({"a": 40, "b": 60}, platform=64).total == 64


def test_measurements_become_model_inputs_and_unmeasured_ones_are_named() -> None:
    m = Measured(
        window_s=100,
        arrivals=50,
        provider_seconds=20,
        provider_samples=30,
        finished=40,
        succeeded=30,
        in_flight=9,
        backlog=3,
    )
    inputs, assumed, why = live_inputs(m, 12, poll_interval=5, target_utilization=0.5)

    assert why is None and inputs is not None
    assert (inputs.arrival_rate, inputs.avg_duration, inputs.provider_slots, inputs.success_rate) == (0.5, 20, 12, 0.75)
    assert (inputs.poll_interval, inputs.backlog, inputs.target_utilization) == (5, 12, 0.5)
    assert assumed == ("output_mb", "media_seconds", "transitions_per_task")
    assert (inputs.output_mb, inputs.media_seconds, inputs.transitions_per_task) == (60.0, 45.0, 14.0)

    full = Measured(
        window_s=10,
        arrivals=1,
        provider_seconds=5,
        finished=2,
        succeeded=1,
        output_bytes=3_000_000,
        media_seconds=2,
        transitions_per_task=9,
    )
    inputs, assumed, _ = live_inputs(full, 1, poll_interval=5)
    assert assumed == () and (inputs.output_mb, inputs.media_seconds, inputs.success_rate) == (3.0, 2, 0.5)


def test_no_estimate_without_arrivals_or_a_measured_provider_time() -> None:
    assert live_inputs(Measured(window_s=60), 4, poll_interval=5) == (None, (), "no task arrived in the window")
    inputs, _, why = live_inputs(Measured(window_s=60, arrivals=3), 4, poll_interval=5)
    assert inputs is None and "W (avg duration) is unknown" in (why or "")


def test_assess_reports_every_configured_and_every_busy_provider() -> None:
    total = Measured(window_s=60, arrivals=90, provider_seconds=6, finished=10, succeeded=10, in_flight=4, backlog=20)
    per = {
        "sim": Measured(window_s=60, arrivals=60, provider_seconds=6, in_flight=2, backlog=20),
        "gone": Measured(window_s=60, in_flight=2),
    }  # still has jobs, no longer configured
    report = assess(total, SlotLimits({"sim": 2, "local": 4}, platform=64), poll_interval=5, per_provider=per)

    assert list(report.providers) == ["gone", "local", "sim"]
    assert report.providers["gone"].slots is None and report.providers["local"].in_flight == 0
    assert report.providers["sim"].time_to_saturation_s == 0.0 and report.providers["sim"].queue_growth_per_min > 0
    assert report.platform.slots == 6 and report.estimate is not None
    assert report.estimate.queue_growth_per_min == report.platform.queue_growth_per_min
    assert report.platform.time_to_saturation_s == pytest.approx(6 * math.log(5 / 3), abs=0.05)
    sim_growth, platform_growth = report.providers["sim"].queue_growth_per_min, report.platform.queue_growth_per_min
    assert pressure_warnings(report) == [
        f"sim: saturated now (2/2 slots in use); the queue grows by {sim_growth:g} tasks/min",
        (
            f"platform: slots saturate in {fmt_duration(report.platform.time_to_saturation_s)} at the measured rates"
            f" (4/6 slots in use); the queue then grows by {platform_growth:g} tasks/min"
        ),
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "never"),
        (0, "now"),
        (42.4, "42s"),
        (725, "12m 5s"),
        (12_000, "3h 20m"),
    ],
)
def test_durations_read_like_an_operator_says_them(seconds: float | None, text: str) -> None:
    assert fmt_duration(seconds) == text
