"""The e2e_overhead benchmark's pure parts: the step counts and baselines, percentiles, the sustained-load verdict,
the rate search, the SSE and redis-benchmark parsers, and the per-task stage split.

Nothing here times anything, starts a process or needs a database."""

from __future__ import annotations

import math

import pytest

from bench.common import BenchError
from bench.e2e.analysis import DETAIL_LABELS, STAGE_LABELS, hop_summary, parse_hop_lines, task_metrics
from bench.e2e.client import TaskRun
from bench.e2e.model import EXPECTED_DERIVED_FILES, anchor_baseline, count_baseline, pipeline, step_counts
from bench.e2e.stats import (
    SseParser,
    completion_rate,
    latency_summary,
    parse_redis_csv,
    percentile,
    round_rate,
    sustained,
)


def test_the_pipeline_counts_match_the_documented_formula() -> None:
    stages = pipeline()
    assert step_counts(stages) == {"commit": 11, "hop": 4, "http": 4, "s3": 3 + EXPECTED_DERIVED_FILES}
    assert step_counts(stages, exclude_media=True) == {"commit": 9, "hop": 3, "http": 4, "s3": 2}
    assert step_counts(pipeline(derived_files=2))["s3"] == 5
    assert [s.name for s in stages if s.media] == ["media"]


def test_count_baseline_is_the_weighted_sum_and_nan_when_a_needed_step_is_missing() -> None:
    lat = {"commit": 0.5, "hop": 0.1, "http": 1.0, "s3": 3.0}
    assert count_baseline(lat, {"commit": 11, "hop": 4, "http": 4, "s3": 8}) == pytest.approx(
        11 * 0.5 + 4 * 0.1 + 4 * 1.0 + 8 * 3.0
    )
    assert count_baseline(lat, {"commit": 2, "s3": 0}) == pytest.approx(1.0)
    assert math.isnan(count_baseline({"commit": 0.5}, {"commit": 1, "hop": 1}))
    assert count_baseline({"commit": 0.5}, {"commit": 1, "hop": 0}) == 0.5


def test_anchor_formula_reproduces_the_recorded_figure() -> None:
    # C.4: 0.62 + 0.51 + 2 × 0.50 + 2 × 0.07 ≈ 2.3 ms
    lat = {"create_task": 0.62, "claim_outbox_1": 0.51, "transition": 0.50, "eval": 0.07}
    assert anchor_baseline(lat) == pytest.approx(2.27)
    assert math.isnan(anchor_baseline({"create_task": 0.62}))


def test_percentile_interpolates_like_numpy_and_ignores_nan() -> None:
    xs = [float(v) for v in range(1, 101)]
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 0) == 1 and percentile(xs, 100) == 100
    assert percentile([3.0, math.nan, 1.0], 50) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    s = latency_summary([1.0, 2.0, 3.0, math.nan])
    assert s["n"] == 3 and s["p50"] == 2.0 and s["max"] == 3.0 and s["mean"] == 2.0
    assert latency_summary([])["n"] == 0


def test_a_flat_point_is_sustained() -> None:
    samples = [(i / 10, 300.0 + (i % 7) * 10) for i in range(100)]
    ok, info = sustained(samples, 100, offered=10, completed=9.8)
    assert ok, info
    assert info["first_quarter_p50_ms"] > 0


def test_growing_latency_unfinished_tasks_or_slow_completions_are_not_sustained() -> None:
    growing = [(i / 10, 300.0 + 40 * i) for i in range(100)]
    ok, info = sustained(growing, 100)
    assert not ok and "grew" in info["reason"]
    flat = [(i / 10, 300.0) for i in range(90)]
    ok, info = sustained(flat, 100)
    assert not ok and "10 of 100" in info["reason"]
    ok, info = sustained([(i / 10, 300.0) for i in range(100)], 100, offered=10, completed=7.0)
    assert not ok and "completed" in info["reason"]
    # within the slack: small absolute growth is noise, not a queue
    ok, _ = sustained([(i / 10, 20.0 + (60.0 if i >= 75 else 0.0)) for i in range(100)], 100)
    assert ok


def test_completion_rate_uses_the_middle_80_percent_of_finishes() -> None:
    assert completion_rate([i * 0.5 for i in range(101)]) == pytest.approx(2.0)
    # a burst of early finishes and a long tail do not move it much
    times = [0.0] * 5 + [10 + i for i in range(90)] + [500.0] * 5
    assert completion_rate(times) == pytest.approx(1.0, rel=0.05)
    assert math.isnan(completion_rate([1.0, 2.0]))


def test_rates_are_rounded_as_a_person_would_pick_them() -> None:
    assert round_rate(1.84) == 2.0 and round_rate(1.2) == 1.0 and round_rate(0.1) == 0.5
    assert round_rate(13.4) == 13.0


def test_sse_parser_yields_data_events_and_skips_comments() -> None:
    p = SseParser()
    lines = [
        ": ping",
        "",
        "id: 3",
        "event: status",
        'data: {"status":"QUEUED","version":3}',
        "",
        "id: 9",
        'data: {"status":',
        'data: "SUCCEEDED"}',
        "",
    ]
    events = [e for e in (p.feed(line) for line in lines) if e is not None]
    assert events == [{"status": "QUEUED", "version": 3}, {"status": "SUCCEEDED"}]


def test_redis_benchmark_csv_is_read() -> None:
    out = (
        '"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms",'
        '"max_latency_ms"\n"LPUSH bench:k xxxx","18867.92","0.047","0.016","0.031","0.095","0.535","1.295"\n'
    )
    r = parse_redis_csv(out)
    assert r["avg_latency_ms"] == 0.047 and r["rps"] == 18867.92 and "test" not in r
    with pytest.raises(BenchError):
        parse_redis_csv("ERR unknown command")


def test_stages_sum_to_the_headline_overhead() -> None:
    t202 = 1000.0
    run = TaskRun(0, 0.0, "k", t_send=999.98, t_202=t202, task_id="t", terminal="SUCCEEDED", t_terminal=t202 + 1.5)
    at = {"DISPATCHING": 0.25, "SUBMITTED": 0.35, "OUTPUT_FETCHING": 0.62, "POST_PROCESSING": 0.75, "SUCCEEDED": 1.45}
    run.events = {k: (t202 + v, t202 + v + 0.01) for k, v in at.items()}
    extras = {"callback_stored": t202 + 0.58, "media_done": t202 + 1.40}
    m = task_metrics(run, extras, 0.2, sim_created=t202 + 0.34)
    assert m["overhead_ms"] == pytest.approx(1300.0)
    assert sum(m[k] for k, _ in STAGE_LABELS) == pytest.approx(m["overhead_ms"])
    assert m["dispatch_wait"] == pytest.approx(250.0)
    assert m["provider_excess"] == pytest.approx(30.0)
    assert m["sim_late_ms"] == pytest.approx(40.0)
    assert m["media_ms"] == pytest.approx(700.0)
    assert m["overhead_ex_media_ms"] == pytest.approx(600.0)
    assert m["committed_ms"] == pytest.approx(1250.0)
    assert m["notify"] == pytest.approx(50.0)
    assert m["post_ms"] == pytest.approx(20.0)
    # the brief's split: provider done → fetched, fetched → media done, media done → SUCCEEDED
    assert m["fetched"] == pytest.approx(170.0)
    assert m["reduce"] + m["fetch"] == pytest.approx(m["fetched"])
    assert m["media"] == pytest.approx(650.0) and m["succeed"] == pytest.approx(50.0)
    assert {k for k, _ in DETAIL_LABELS} <= set(m)


def test_database_timestamps_win_over_the_sse_ones() -> None:
    run = TaskRun(0, 0.0, "k", t_send=0.0, t_202=10.0, task_id="t", terminal="SUCCEEDED", t_terminal=11.0)
    run.events = {"DISPATCHING": (10.9, 10.95)}
    m = task_metrics(run, {"state_at": {"DISPATCHING": 10.1}}, 0.2, None)
    assert m["dispatch_wait"] == pytest.approx(100.0)
    assert "sim_late_ms" not in m


def test_hop_lines_keep_the_first_start_inside_the_window() -> None:
    lines = [
        "m1\tsubmit\t1000\t1004.5\n",
        "m1\tsubmit\t1000\t1900.0\n",  # a redelivery: not a second hop
        "m2\tfetch\t1100\t1102.0",
        "m3\tmedia\t5000\t5001.0",  # after the window
        "garbage",
        "m4\tx\tnot-a-number\t1.0",
    ]
    started = parse_hop_lines(lines, 1000.0, 2000.0)
    assert started == {"m1": ("submit", 1000.0, 1004.5), "m2": ("fetch", 1100.0, 1102.0)}
    rows = [
        {"actor": "submit", "hop_ms": 4.0, "relay_ms": 1.0, "broker_ms": 3.0},
        {"actor": "fetch", "hop_ms": 8.0, "relay_ms": 2.0, "broker_ms": 6.0},
    ]
    s = hop_summary(rows)
    assert s["messages"] == 2 and s["hop_ms"]["p50"] == 6.0 and s["broker_ms"]["max"] == 6.0
    assert set(s["by_actor"]) == {"fetch", "submit"}
