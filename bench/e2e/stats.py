"""Statistics and parsers of the e2e benchmark: percentiles, the sustained-load verdict, completion rates, the
rate search, the SSE and redis-benchmark parsers. Pure."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from bench.common import BenchError

#: a point is "not sustained" when the p50 of its last quarter exceeds this × the first quarter's + the slack
TREND_FACTOR, TREND_SLACK_MS = 1.5, 50.0
#: ... or when tasks complete at less than this share of the offered rate
COMPLETION_SHARE = 0.85


# ------------------------------------------------------------------------------------------- statistics
# ------------------------------------------------------------------------------------------- statistics
def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values. q in [0, 100]."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return math.nan
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {
            "n": 0,
            "p50": math.nan,
            "p90": math.nan,
            "p99": math.nan,
            "max": math.nan,
            "mean": math.nan,
            "min": math.nan,
        }
    return {
        "n": len(xs),
        "min": min(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def sustained(
    samples: Sequence[tuple[float, float]],
    total: int,
    *,
    offered: float | None = None,
    completed: float | None = None,
    factor: float = TREND_FACTOR,
    slack_ms: float = TREND_SLACK_MS,
) -> tuple[bool, dict[str, Any]]:
    """Did the point keep up? `samples` are (scheduled send offset s, overhead ms) of the finished tasks, `total`
    the tasks planned; `offered` and `completed` the planned rate and the measured completion rate (tasks/s).
    Not sustained when a task was not sent or did not finish, when tasks completed at less than
    COMPLETION_SHARE × the offered rate, or when the median overhead of the last quarter (by send time) exceeds
    factor × the first quarter's + slack: latency that grows with time is a queue building up."""
    done = sorted(samples)
    info: dict[str, Any] = {"finished": len(done), "planned": total}
    if len(done) < total:
        info["reason"] = f"{total - len(done)} of {total} task(s) not sent or not finished"
        return False, info
    if offered and completed is not None and math.isfinite(completed) and completed < COMPLETION_SHARE * offered:
        info["reason"] = (
            f"completed {completed:.2f}/s < {COMPLETION_SHARE:g} × the offered {offered:g}/s: a backlog built up"
        )
        return False, info
    if len(done) < 8:
        info["reason"] = "too few tasks to see a trend"
        return True, info
    q = len(done) // 4
    first = statistics.median(v for _, v in done[:q])
    last = statistics.median(v for _, v in done[-q:])
    info.update(first_quarter_p50_ms=first, last_quarter_p50_ms=last)
    ok = last <= factor * first + slack_ms
    if not ok:
        info["reason"] = (
            f"p50 grew from {first:.0f} ms (first quarter) to {last:.0f} ms (last quarter): a backlog built up"
        )
    return ok, info


def completion_rate(terminal_times: Sequence[float]) -> float:
    """Tasks finished per second between the 10th and 90th percentile of the finish times (the saturated
    throughput when the point was overloaded); NaN with fewer than 10 finishes."""
    ts = sorted(t for t in terminal_times if math.isfinite(t))
    if len(ts) < 10:
        return math.nan
    i, j = len(ts) // 10, (len(ts) * 9) // 10
    span = ts[j] - ts[i]
    return (j - i) / span if span > 0 else math.nan


def round_rate(r: float) -> float:
    """Rates as a person would pick them: 0.5 steps below 10/s, whole numbers above."""
    if r < 10:
        return max(0.5, round(r * 2) / 2)
    return float(round(r))


class SseParser:
    """Server-Sent Events, line by line: `feed(line)` returns the event's parsed JSON data once its blank line
    arrives (None otherwise). Comment lines (`: ping`) and fields other than data are ignored."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> Any:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data:
                return None
            text, self._data = "\n".join(self._data), []
            return json.loads(text)
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


def parse_redis_csv(text: str) -> dict[str, float]:
    """redis-benchmark --csv: the first data row as {"rps", "avg_latency_ms", "p50_latency_ms", ...}."""
    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(rows) < 2:
        raise BenchError(f"cannot read redis-benchmark output:\n{text[-500:]}")
    head = [h.strip('"') for h in rows[0].split('","')]
    vals = [v.strip('"') for v in re.findall(r'"((?:[^"]|"")*)"', rows[1])]
    out: dict[str, float] = {}
    for h, v in zip(head, vals, strict=False):
        if h != "test":
            try:
                out[h] = float(v)
            except ValueError:
                pass
    return out


def ts(text: str | None) -> float:
    return datetime.fromisoformat(text).timestamp() if text else math.nan
