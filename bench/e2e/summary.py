"""The run's summary: per repetition the count-based and anchor baselines (A, B) and the ratios of the idle and
load points to them, and the figures users feel (issue 12: idle overhead, stage split, hops, saturation, the
load at half of it, CPU per task) with their targets."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from bench import common
from bench.common import Repetition
from bench.e2e import model
from bench.e2e.analysis import DETAIL_LABELS, STAGE_LABELS
from bench.e2e.baseline import baselines_of

#: (point, metric key in the point summary, baseline kind) → the figures of the main table
FIGURES = (
    ("load", "overhead_ms", "count", "headline"),
    ("idle", "overhead_ms", "count", "headline"),
    ("load", "committed_ms", "count", "committed"),
    ("idle", "committed_ms", "count", "committed"),
    ("load", "overhead_ex_media_ms", "count_ex_media", "media-excluded"),
    ("idle", "overhead_ex_media_ms", "count_ex_media", "media-excluded"),
)


def summarize_run(
    reps: list[dict[str, Any]], derived_files: int, job_s: float
) -> tuple[dict[str, Any], list[Repetition]]:
    rep_objs: list[Repetition] = []
    for r in reps:
        ba, bb = baselines_of(r["baseline_a"], derived_files), baselines_of(r["baseline_b"], derived_files)
        r["baselines"] = {"a": ba, "b": bb}
        obj = Repetition(
            r["index"],
            ba["count"],
            r["load"]["summary"]["overhead_ms"]["p50"],
            bb["count"],
            raw={"baselines": r["baselines"]},
        )
        rep_objs.append(obj)
    kept = [(r, o) for r, o in zip(reps, rep_objs, strict=True) if o.kept]
    kept_anchor = [
        r for r in reps if common.baselines_agree(r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"])
    ]
    kept_ex = [
        r
        for r in reps
        if common.baselines_agree(r["baselines"]["a"]["count_ex_media"], r["baselines"]["b"]["count_ex_media"])
    ]

    def spread(
        fn: Callable[[dict[str, Any]], float], among: Sequence[dict[str, Any]] | None = None
    ) -> dict[str, Any] | None:
        s = common.summarize(fn(r) for r in (among if among is not None else [r for r, _ in kept]))
        return s.as_dict() if s else None

    def base(r: dict[str, Any], kind: str) -> float:
        return (r["baselines"]["a"][kind] + r["baselines"]["b"][kind]) / 2

    figures = []
    for point, metric, kind, label in FIGURES:
        for q in ("p50", "p99"):
            figures.append(
                {
                    "point": point,
                    "metric": metric,
                    "label": label,
                    "q": q,
                    "baseline": kind,
                    "ms": spread(lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q]),
                    "ms_all": spread(lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q], reps),
                    "ratio": spread(
                        lambda r, p=point, m=metric, q=q, k=kind: r[p]["summary"][m][q] / base(r, k),
                        kept_ex if kind == "count_ex_media" else None,
                    ),
                    "ratio_all": spread(
                        lambda r, p=point, m=metric, q=q, k=kind: r[p]["summary"][m][q] / base(r, k), reps
                    ),
                    "ratio_anchor": spread(
                        lambda r, p=point, m=metric, q=q: r[p]["summary"][m][q] / base(r, "anchor"), kept_anchor
                    ),
                    "kept": len(kept_ex) if kind == "count_ex_media" else len(kept),
                    "kept_anchor": len(kept_anchor),
                }
            )
    steps = {}
    for key in ("commit", "hop", "http", "s3", "lpush", "brpop", "create_task", "claim_outbox_1", "transition", "eval"):
        steps[key] = spread(
            lambda r, k=key: (r["baseline_a"]["latency_ms"][k] + r["baseline_b"]["latency_ms"][k]) / 2, reps
        )
    stages = {}
    for point in ("idle", "load"):
        stages[point] = {
            k: {q: spread(lambda r, p=point, k=k, q=q: r[p]["summary"][k][q], reps) for q in ("p50", "p99")}
            for k in [s for s, _ in STAGE_LABELS + DETAIL_LABELS] + ["media_ms"]
        }
    summary = {
        "kept": len(kept),
        "kept_anchor": len(kept_anchor),
        "total": len(reps),
        "derived_files": derived_files,
        "job_seconds": job_s,
        "baseline_count_ms": spread(lambda r: base(r, "count"), reps),
        "baseline_count_ex_media_ms": spread(lambda r: base(r, "count_ex_media"), reps),
        "baseline_anchor_ms": spread(lambda r: base(r, "anchor"), reps),
        "steps_ms": steps,
        "figures": figures,
        "stages": stages,
        "load_rate": reps[0]["load"]["offered_rate"] if reps else None,
        "load_sustained": [r["load"]["sustained"] for r in reps],
        "load_completion_rate": spread(lambda r: r["load"]["completion_rate"]),
        "idle_completion_rate": spread(lambda r: r["idle"]["completion_rate"]),
        "hops": {
            point: {
                part: {q: spread(lambda r, p=point, x=part, q=q: r[p]["hops"][x][q], reps) for q in ("p50", "p99")}
                for part in ("hop_ms", "relay_ms", "broker_ms")
            }
            for point in ("idle", "load")
        },
    }
    return summary, rep_objs


def _rep_doc(r: dict[str, Any], o: Repetition) -> dict[str, Any]:
    return {
        **r,
        "headline_baseline_divergence": o.divergence if math.isfinite(o.divergence) else None,
        "anchor_baseline_divergence": common.baseline_divergence(
            r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"]
        ),
        "kept": o.kept,
        "kept_anchor": common.baselines_agree(r["baselines"]["a"]["anchor"], r["baselines"]["b"]["anchor"]),
    }


def _median(values: Sequence[float]) -> float | None:
    s = common.summarize(v for v in values if v is not None and math.isfinite(v))
    return s.median if s else None


def felt(summary: dict[str, Any], reps: list[dict[str, Any]], saturation: dict[str, Any]) -> dict[str, Any]:
    """The figures of issue 12 (medians over the repetitions), each with its target and whether it was met."""

    def med(fn: Callable[[dict[str, Any]], float]) -> float | None:
        return _median([fn(r) for r in reps])

    idle_p50 = med(lambda r: r["idle"]["summary"]["overhead_ms"]["p50"])
    idle_p99 = med(lambda r: r["idle"]["summary"]["overhead_ms"]["p99"])
    load_p99 = med(lambda r: r["load"]["summary"]["overhead_ms"]["p99"])
    hop_p50 = med(lambda r: r["idle"]["hops"]["hop_ms"]["p50"])
    hop_p99 = med(lambda r: r["idle"]["hops"]["hop_ms"]["p99"])
    sat = saturation.get("rate")
    best = next((p for p in saturation.get("points", []) if p.get("saturation_rate") == sat), {})
    ratio = load_p99 / idle_p99 if load_p99 is not None and idle_p99 else None

    def met(v: float | None, ok: Callable[[float], bool]) -> bool | None:
        return None if v is None or not math.isfinite(v) else ok(v)

    return {
        "idle_overhead_ms": {"p50": idle_p50, "p99": idle_p99},
        "idle_stages_ms": {
            k: {q: (summary["stages"]["idle"][k][q] or {}).get("median") for q in ("p50", "p99")}
            for k, _ in STAGE_LABELS + DETAIL_LABELS
        },
        "idle_hop_ms": {
            "p50": hop_p50,
            "p99": hop_p99,
            "by_actor": reps[-1]["idle"]["hops"]["by_actor"] if reps else {},
        },
        "load_hop_ms": {
            "p50": med(lambda r: r["load"]["hops"]["hop_ms"]["p50"]),
            "p99": med(lambda r: r["load"]["hops"]["hop_ms"]["p99"]),
        },
        "saturation_tasks_per_s": sat,
        "saturation_concurrency": saturation.get("concurrency"),
        "half_load": {
            "rate": reps[0]["load"]["offered_rate"] if reps else None,
            "p50_ms": med(lambda r: r["load"]["summary"]["overhead_ms"]["p50"]),
            "p99_ms": load_p99,
            "p99_over_idle_p99": ratio,
            "sustained": [r["load"]["sustained"] for r in reps],
        },
        "cpu_s_per_task": (best.get("cpu") or {}).get("cpu_s_per_task", {}),
        "cpu_box_busy_fraction": (best.get("cpu") or {}).get("box_busy_fraction"),
        "targets": {
            "idle p50 <= 150 ms": met(idle_p50, lambda v: v <= model.IDLE_P50_TARGET_MS),
            "idle p99 <= 300 ms": met(idle_p99, lambda v: v <= model.IDLE_P99_TARGET_MS),
            "saturation >= 12 tasks/s": met(sat, lambda v: v >= model.SATURATION_TARGET),
            "p99 at 50 % of saturation <= 2 x idle p99": met(ratio, lambda v: v <= model.HALF_LOAD_P99_X),
            "hop (enqueue -> actor) p50 <= 5 ms": met(hop_p50, lambda v: v <= 5.0),
        },
    }
