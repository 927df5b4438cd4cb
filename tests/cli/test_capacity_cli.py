"""`aivedio capacity estimate`: JSON contract, human table, usage errors, help."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aivedio_cli.main import app

SEED_ARGS = [
    "--arrival-rate", "3", "--avg-duration", "180", "--target-utilization", "0.75", "--provider-slots", "400",
    "--success-rate", "0.9", "--output-mb", "60", "--burst-factor", "2", "--media-seconds", "45",
    "--vcpu-per-media-job", "2", "--transitions-per-task", "14", "--poll-interval", "10", "--backlog", "5000",
    "--connections", "100000", "--kb-per-connection", "20",
]  # fmt: skip

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


def run(*args: str):
    return CliRunner().invoke(app, ["capacity", "estimate", *args])


def test_json_prints_exactly_the_thirteen_seed_figures() -> None:
    result = run(*SEED_ARGS, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == set(SEED_FIGURES)
    assert data == pytest.approx(SEED_FIGURES, abs=1e-9)


def test_json_without_slots_has_null_throughput() -> None:
    result = run("--arrival-rate", "3", "--avg-duration", "180", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["max_throughput_per_s"] is None
    assert data["queue_growth_per_min"] == 0


def test_human_output_mentions_every_figure_and_warns_when_overloaded() -> None:
    result = run(*SEED_ARGS)
    assert result.exit_code == 0, result.output
    for name in SEED_FIGURES:
        assert name in result.stdout
    for shown in ("540", "720", "2.22", "46.8", "121.5", "243"):
        assert shown in result.stdout
    warning = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1
    assert "46.8 tasks/min" in warning[0] and "320 more provider slots" in warning[0]


def test_no_warning_when_not_overloaded() -> None:
    result = run("--arrival-rate", "1", "--avg-duration", "180", "--provider-slots", "400")
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-utilization", "1.5"], "error: --target-utilization must be in (0, 1], got 1.5"),
        (["--success-rate", "2"], "error: --success-rate must be in [0, 1], got 2.0"),
        (["--poll-interval", "0"], "error: --poll-interval must be > 0, got 0.0"),
        (["--burst-factor", "0.5"], "error: --burst-factor must be >= 1, got 0.5"),
        (["--backlog", "-1"], "error: --backlog must be >= 0, got -1"),
    ],
)
def test_bad_input_is_a_usage_error_with_one_line(args: list[str], message: str) -> None:
    result = run("--arrival-rate", "3", "--avg-duration", "180", *args)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [message]
    assert result.stdout == ""


def test_non_positive_arrival_rate_is_a_usage_error() -> None:
    result = run("--arrival-rate", "0", "--avg-duration", "180")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: --arrival-rate must be > 0, got 0.0"]


def test_help_lists_every_option() -> None:
    result = CliRunner().invoke(app, ["capacity", "estimate", "--help"], terminal_width=200)
    assert result.exit_code == 0
    options = [arg for arg in SEED_ARGS if arg.startswith("--")] + ["--json"]
    assert len(options) == 15
    for option in options:
        assert option in result.stdout
