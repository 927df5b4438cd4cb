"""The headline figures of each benchmark: what `bench/run NAME --record` keeps in bench/results/latest.json and
what docs/benchmarks.md shows (docsgen/benchmarks.py renders it from that file).

A headline reads one number out of the benchmark's JSON document; a figure the document lacks (a point not run,
a failed run) is recorded as null, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common

LATEST = common.RESULTS_DIR / "latest.json"

Doc = dict[str, Any]


@dataclass(frozen=True)
class Headline:
    key: str
    figure: str
    unit: str
    target: str
    read: Callable[[Doc], Any]

    def value(self, doc: Doc) -> float | None:
        try:
            x = self.read(doc)
        except (KeyError, IndexError, TypeError, ValueError, StopIteration):
            return None
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _api(t: int, field: str) -> Callable[[Doc], Any]:
    return lambda d: d["summary"][f"tenants_{t}"][field]["median"]


def _reducer(point: str, field: str) -> Callable[[Doc], Any]:
    return lambda d: d["summary"]["points"][point][field]["median"]


def _hop(kind: str, field: str) -> Callable[[Doc], Any]:
    return lambda d: next(r for r in d["results"] if r["kind"] == kind)[field]


def _sse(streams: int, field: str) -> Callable[[Doc], Any]:
    return lambda d: next(p for p in d["points"] if p["streams"] == streams)["summary"]["system"][field]


def _slowest_completion(d: Doc) -> float:
    return max(c["median_s"] for label, c in d["cases"].items() if label.startswith("complete:"))


HEADLINES: dict[str, list[Headline]] = {
    "api_create": [
        Headline(
            "api_vs_own_t1",
            "API creates ÷ our own create transaction, 1 tenant",
            "",
            "≥ 0.6",
            _api(1, "client_path_cost"),
        ),
        Headline(
            "api_vs_own_t16",
            "API creates ÷ our own create transaction, 16 tenants",
            "",
            "≥ 0.6",
            _api(16, "client_path_cost"),
        ),
        Headline(
            "api_vs_minimal_t1", "API creates ÷ the minimal create, 1 tenant", "", "≥ 0.25", _api(1, "ratio_vs_minimal")
        ),
        Headline(
            "api_vs_minimal_t16",
            "API creates ÷ the minimal create, 16 tenants",
            "",
            "≥ 0.25",
            _api(16, "ratio_vs_minimal"),
        ),
        Headline(
            "creates_per_s_t1", "creates per second at c=16, 1 tenant", "/s", "", _api(1, "api_created_per_s_c16")
        ),
    ],
    "reducer": [
        Headline(
            "dramatiq_vs_minimal_t1",
            "events reduced through Dramatiq ÷ the minimal transition, 1 tenant",
            "",
            "≥ 0.25",
            _reducer("dramatiq_c16_t1", "ratio_vs_minimal"),
        ),
        Headline(
            "dramatiq_vs_minimal_t16",
            "events reduced through Dramatiq ÷ the minimal transition, 16 tenants",
            "",
            "≥ 0.25",
            _reducer("dramatiq_c16_t16", "ratio_vs_minimal"),
        ),
        Headline(
            "dramatiq_events_per_s_t1",
            "events per second through Dramatiq, 1 tenant",
            "/s",
            "",
            _reducer("dramatiq_c16_t1", "events_per_s"),
        ),
    ],
    "e2e_overhead": [
        Headline(
            "idle_p50_ms",
            "overhead at idle, p50 (one task at a time)",
            "ms",
            "≤ 150 ms",
            lambda d: d["summary"]["felt"]["idle_overhead_ms"]["p50"],
        ),
        Headline(
            "idle_p99_ms",
            "overhead at idle, p99",
            "ms",
            "≤ 300 ms",
            lambda d: d["summary"]["felt"]["idle_overhead_ms"]["p99"],
        ),
        Headline(
            "hop_p50_ms",
            "enqueue → actor start (outbox, relay, broker), p50",
            "ms",
            "≤ 5 ms",
            lambda d: d["summary"]["felt"]["idle_hop_ms"]["p50"],
        ),
        Headline(
            "saturation_tasks_per_s",
            "saturation, closed loop",
            "tasks/s",
            "≥ 12 tasks/s",
            lambda d: d["summary"]["felt"]["saturation_tasks_per_s"],
        ),
        Headline(
            "half_load_p99_ratio",
            "p99 at half of saturation ÷ idle p99",
            "",
            "≤ 2",
            lambda d: d["summary"]["felt"]["half_load"]["p99_over_idle_p99"],
        ),
    ],
    "broker_hop": [
        Headline(
            "rabbitmq_p50_ms", "enqueue → actor at idle on RabbitMQ, p50", "ms", "≤ 5 ms", _hop("rabbitmq", "p50_ms")
        ),
        Headline("rabbitmq_p99_ms", "enqueue → actor at idle on RabbitMQ, p99", "ms", "", _hop("rabbitmq", "p99_ms")),
        Headline(
            "rabbitmq_idle_traffic",
            "broker traffic of one idle worker process",
            "frames/s",
            "no more than Redis polling",
            _hop("rabbitmq", "idle_traffic_per_s"),
        ),
    ],
    "cli_start": [
        Headline(
            "help_median_s",
            "`aivedio --help` start-up, median",
            "s",
            "≤ 0.5 s",
            lambda d: d["cases"]["aivedio --help"]["median_s"],
        ),
        Headline(
            "slowest_completion_median_s", "the slowest shell completion, median", "s", "≤ 0.5 s", _slowest_completion
        ),
    ],
    "relay": [
        Headline("relay_vs_slower_part", "outbox relay ÷ the slower of its parts", "", "≥ 0.30", lambda d: d["ratio"]),
        Headline("relay_vs_api_create", "outbox relay ÷ api_create's rate", "", "≥ 5", lambda d: d["vs_api_create"]),
    ],
    "backlog": [
        Headline(
            "relay_ratio", "relay with a backlog of old rows ÷ on empty tables", "", "≥ 0.8", lambda d: d["relay_ratio"]
        ),
        Headline(
            "reducer_ratio",
            "reducer with a backlog of old rows ÷ on empty tables",
            "",
            "≥ 0.8",
            lambda d: d["reducer_ratio"],
        ),
    ],
    "memory_inflight": [
        Headline("ratio", "memory of in-flight tasks ÷ their raw bytes", "", "≤ 1.25", lambda d: d["ratio"]),
    ],
    "sse_fanout": [
        Headline(
            "kib_per_stream_10k", "memory per idle stream, 10k streams", "KiB", "20 KB", _sse(10_000, "kib_per_stream")
        ),
        Headline("all_s_1k", "one change → every stream of a task, 1k streams", "s", "", _sse(1_000, "all_s")),
        Headline("all_s_10k", "one change → every stream of a task, 10k streams", "s", "", _sse(10_000, "all_s")),
    ],
    "chaos": [
        Headline("violations", "invariant violations after the faults", "", "0", lambda d: len(d["violations"])),
        Headline("tasks", "tasks in the run", "", "", lambda d: d["tasks"]),
    ],
}


def figures(name: str, doc: Doc) -> dict[str, float | None]:
    return {h.key: h.value(doc) for h in HEADLINES.get(name, [])}


def load(path: Path | None = None) -> dict[str, Any]:
    path = path or LATEST
    if not path.exists():
        return {"benchmarks": {}}
    return dict(json.loads(path.read_text(encoding="utf-8")))


def record(name: str, doc: Doc, command: str, path: Path | None = None, *, source: str | None = None) -> dict[str, Any]:
    """Replace NAME's entry of latest.json with this run's headline figures, date, commit and machine."""
    path = path or LATEST
    git = common.git_info()
    machine = common.machine_info()
    machine.pop("hostname", None)  # the file is committed: which machine kind, not which host
    entry = {
        "recorded": common.utc_now(),
        "commit": (git.get("commit") or "")[:7] or None,
        "dirty": git.get("dirty"),
        "machine": machine,
        "command": command,
        "source": source or f"bench/run {name} --record",
        "figures": figures(name, doc),
    }
    latest = load(path)
    latest.setdefault("benchmarks", {})[name] = entry
    latest["benchmarks"] = dict(sorted(latest["benchmarks"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(common.json_clean(latest), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return entry
