"""The benchmark harness's arithmetic: A-B-A ratio, the 10 % discard rule, median and spread of kept reps.

Pure functions only — nothing here times anything."""

from __future__ import annotations

import math

import pytest

from bench.common import (
    MAX_BASELINE_DIVERGENCE,
    Repetition,
    Spread,
    apply_quick,
    baseline_divergence,
    baselines_agree,
    json_clean,
    kept,
    ratio,
    script_round_trips,
    summarize,
    summarize_kept,
)


def test_ratio_is_system_over_mean_of_baselines() -> None:
    assert ratio(500.0, 900.0, 1100.0) == pytest.approx(0.5)
    assert ratio(0.0, 1000.0, 1000.0) == 0.0


def test_ratio_without_usable_baselines_is_nan() -> None:
    assert math.isnan(ratio(100.0, 0.0, 0.0))


def test_divergence_is_relative_to_the_smaller_baseline_and_symmetric() -> None:
    assert baseline_divergence(1000.0, 1100.0) == pytest.approx(0.10)
    assert baseline_divergence(1100.0, 1000.0) == pytest.approx(0.10)
    assert baseline_divergence(1000.0, 1000.0) == 0.0


def test_divergence_of_a_broken_baseline_is_infinite() -> None:
    assert baseline_divergence(0.0, 1000.0) == math.inf
    assert baseline_divergence(-1.0, 1000.0) == math.inf
    assert baseline_divergence(float("nan"), 1000.0) == math.inf


def test_the_tolerance_is_ten_percent_and_inclusive() -> None:
    assert MAX_BASELINE_DIVERGENCE == 0.10
    assert baselines_agree(1000.0, 1100.0)  # exactly 10 %: kept
    assert baselines_agree(1000.0, 1099.9)
    assert not baselines_agree(1000.0, 1100.2)  # just over: discarded
    assert not baselines_agree(1000.0, 900.0)  # 11.1 % relative to the smaller one
    assert baselines_agree(1000.0, 1200.0, tolerance=0.25)


def test_a_repetition_is_discarded_when_its_baselines_diverge() -> None:
    good = Repetition(1, a=1000.0, system=500.0, b=1050.0)
    bad = Repetition(2, a=1000.0, system=500.0, b=1200.0)
    assert good.kept and not bad.kept
    assert good.ratio == pytest.approx(500.0 / 1025.0)
    assert bad.ratio == pytest.approx(500.0 / 1100.0)  # still computed, just not counted
    assert kept([good, bad]) == [good]


def test_summary_uses_kept_repetitions_only() -> None:
    reps = [
        Repetition(1, a=1000.0, system=400.0, b=1000.0),  # 0.40
        Repetition(2, a=1000.0, system=9000.0, b=2000.0),  # diverged: its 6.0 must not count
        Repetition(3, a=1000.0, system=600.0, b=1000.0),  # 0.60
        Repetition(4, a=1000.0, system=500.0, b=1000.0),  # 0.50
    ]
    s = summarize_kept(reps, lambda r: r.ratio)
    assert s == Spread(median=pytest.approx(0.5), lo=pytest.approx(0.4), hi=pytest.approx(0.6), n=3)


def test_median_of_an_even_count_is_the_midpoint() -> None:
    s = summarize([1.0, 4.0, 2.0, 3.0])
    assert s is not None and s.median == 2.5 and (s.lo, s.hi, s.n) == (1.0, 4.0, 4)


def test_summary_skips_nan_and_is_none_when_nothing_is_left() -> None:
    s = summarize([float("nan"), 2.0])
    assert s is not None and (s.median, s.n) == (2.0, 1)
    assert summarize([]) is None
    assert summarize([float("nan")]) is None
    all_discarded = [Repetition(1, a=1000.0, system=1.0, b=2000.0)]
    assert summarize_kept(all_discarded, lambda r: r.ratio) is None


def test_repetition_serializes_non_finite_numbers_as_null() -> None:
    d = Repetition(1, a=0.0, system=1.0, b=1000.0).as_dict()
    assert d["kept"] is False and d["baseline_divergence"] is None and d["ratio"] == pytest.approx(0.002)


def test_a_pgbench_script_costs_one_round_trip_per_command_and_one_per_pipeline() -> None:
    script = "\n".join(
        [
            "-- comment; not a command",
            "\\set idx :base + 1",
            "BEGIN;",
            "INSERT INTO t (a) VALUES (1)",
            "  RETURNING a AS x \\gset",
            "SELECT 'a;b', ';';",
            "\\startpipeline",
            "INSERT INTO t (a) VALUES (2);",
            "INSERT INTO t (a) VALUES (3);",
            "\\endpipeline",
            "\\if :x > 0",
            "UPDATE t SET a = a",
            "  WHERE a = 'multi-line;",
            "literal';",
            "\\endif",
            "COMMIT;",
        ]
    )
    # BEGIN, INSERT … \gset, SELECT, the pipeline, UPDATE, COMMIT
    assert script_round_trips(script) == 6


def test_json_output_has_no_nan_or_infinity() -> None:
    assert json_clean({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}}) == {
        "a": None,
        "b": [1.0, None],
        "c": {"d": 2},
    }


def test_quick_only_changes_options_left_at_their_default() -> None:
    class Args:
        quick, reps, duration = True, 3, 8

    args = Args()
    changed = apply_quick(args, {"reps": 1, "duration": 5}, {"reps": 3, "duration": 20})
    assert (args.reps, args.duration) == (1, 8) and changed == {"reps": 1}
    args.quick = False
    args.reps = 3
    assert apply_quick(args, {"reps": 1}, {"reps": 3}) == {} and args.reps == 3
