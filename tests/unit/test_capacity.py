"""The capacity model: the seed's worked example, validation, invariants, purity."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.domain.capacity import FIGURES, CapacityInputError, CapacityInputs, estimate, explain

SEED = CapacityInputs(
    arrival_rate=3,
    avg_duration=180,
    target_utilization=0.75,
    provider_slots=400,
    success_rate=0.9,
    output_mb=60,
    burst_factor=2,
    media_seconds=45,
    vcpu_per_media_job=2,
    transitions_per_task=14,
    poll_interval=10,
    backlog=5000,
    connections=100_000,
    kb_per_connection=20,
)

#: The figures as printed.
SEED_FIGURES = {
    "in_flight": 540,
    "required_slots": 720,
    "max_throughput_per_s": 2.22,
    "queue_growth_per_min": 46.8,
    "polling_qps": 54,
    "polling_qps_at_backlog": 500,
    "fetch_mb_per_s": 162,
    "fetch_gbit_per_s": 1.30,
    "fetch_gbit_per_s_planned": 2.6,
    "media_concurrency": 121.5,
    "media_vcpu": 243,
    "db_transition_writes_per_s": 42,
    "sse_memory_gb": 2.0,
}


def test_seed_worked_example_reproduces_every_printed_figure() -> None:
    figures = estimate(SEED).figures()
    assert list(figures) == list(FIGURES)
    assert figures == pytest.approx(SEED_FIGURES, abs=1e-9)


def test_derived_figures_use_the_rounded_upstream_figure() -> None:
    est = estimate(SEED)
    assert est.queue_growth_per_min == pytest.approx(46.8)  # (3 - 2.22) * 60, not (3 - 400/180) * 60 = 46.67
    assert est.fetch_gbit_per_s_planned == pytest.approx(2.6)  # 1.30 * 2, not 1.296 * 2 = 2.59


def test_every_figure_is_a_float_with_at_most_two_decimals() -> None:
    odd = replace(SEED, arrival_rate=1.2345, avg_duration=77.7, provider_slots=33)
    for value in estimate(odd).figures().values():
        assert isinstance(value, float)
        assert value == round(value, 2)


def test_without_provider_slots_throughput_is_unknown_and_growth_zero() -> None:
    est = estimate(replace(SEED, provider_slots=None))
    assert est.max_throughput_per_s is None
    assert est.queue_growth_per_min == 0
    assert not est.overloaded


def test_not_overloaded_means_no_growth() -> None:
    est = estimate(replace(SEED, provider_slots=1000))  # μ = 5.56 > λ = 3
    assert est.max_throughput_per_s == pytest.approx(5.56)
    assert est.queue_growth_per_min == 0
    assert not est.overloaded


def test_explain_gives_one_line_per_figure_with_the_actual_numbers() -> None:
    rows = explain(estimate(SEED), SEED)
    assert [name for name, _, _ in rows] == list(FIGURES)
    how = dict((name, text) for name, _, text in rows)
    assert how["in_flight"] == "L = λ × W = 3 × 180 = 540 (Little's law)"
    assert "(3 − 2.22) × 60 = 46.8" in how["queue_growth_per_min"]
    assert all("\n" not in text for text in how.values())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("arrival_rate", 0),
        ("arrival_rate", -1),
        ("avg_duration", 0),
        ("avg_duration", -5),
        ("target_utilization", 0),
        ("target_utilization", 1.5),
        ("success_rate", -0.1),
        ("success_rate", 1.01),
        ("provider_slots", -1),
        ("output_mb", -1),
        ("burst_factor", 0.5),
        ("media_seconds", -1),
        ("vcpu_per_media_job", -1),
        ("transitions_per_task", -1),
        ("poll_interval", 0),
        ("poll_interval", -10),
        ("backlog", -1),
        ("connections", -1),
        ("kb_per_connection", -1),
        ("arrival_rate", float("nan")),
        ("output_mb", float("inf")),
    ],
)
def test_invalid_input_raises_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(CapacityInputError) as info:
        replace(SEED, **{field: value})
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field} must be")


def test_boundaries_that_are_valid() -> None:
    replace(SEED, target_utilization=1, success_rate=0, burst_factor=1, backlog=0, connections=0, provider_slots=0)


rates = st.floats(min_value=0.001, max_value=10_000, allow_nan=False, allow_infinity=False)
durations = st.floats(min_value=0.01, max_value=100_000, allow_nan=False, allow_infinity=False)
utilizations = st.floats(min_value=0.0, max_value=1.0, exclude_min=True)
slots = st.integers(min_value=0, max_value=10_000_000)


@given(rate=rates, duration=durations, rho=utilizations)
def test_in_flight_never_exceeds_required_slots(rate: float, duration: float, rho: float) -> None:
    est = estimate(CapacityInputs(arrival_rate=rate, avg_duration=duration, target_utilization=rho))
    assert est.in_flight <= est.required_slots


@given(rate=rates, duration=durations, c=slots)
def test_queue_grows_exactly_when_arrivals_exceed_reported_throughput(rate: float, duration: float, c: int) -> None:
    """growth = round(max(0, λ - μ) × 60, 2) with μ the reported (rounded) C / W.

    So: growth > 0 implies λ > μ; λ <= μ implies growth == 0; and any excess that survives rounding
    (≥ 0.01/min) shows. Against the exact C / W the same holds outside a ±0.01 task/s band.
    """
    est = estimate(CapacityInputs(arrival_rate=rate, avg_duration=duration, provider_slots=c))
    mu = est.max_throughput_per_s
    assert mu is not None
    assert est.overloaded == (est.queue_growth_per_min > 0)
    if est.queue_growth_per_min > 0:
        assert rate > mu
    if rate <= mu:
        assert est.queue_growth_per_min == 0
    if (rate - mu) * 60 >= 0.01:
        assert est.queue_growth_per_min > 0
    exact_mu = c / duration
    if rate > exact_mu + 0.01:
        assert est.queue_growth_per_min > 0
    if rate < exact_mu - 0.01:
        assert est.queue_growth_per_min == 0


def test_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import aivedio_engine.domain.capacity\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'aivedio_engine'}))\n"
        "print(sorted(m for m in ('pydantic', 'typer', 'rich', 'sqlalchemy') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["[]", "[]"]
