"""Capacity planning, pure: Little's law, polling, bandwidth, media, database writes, SSE.

Rounding rule: every reported figure is rounded to 2 decimals, and every figure derived from another
reported figure is computed from the *reported* (rounded) value, as the seed does. That is what makes
the seed's worked example come out exactly as printed: queue growth is (3 - 2.22) × 60 = 46.8, not
(3 - 400/180) × 60 = 46.67, and the planned bandwidth is 1.30 × 2 = 2.6, not 1.296 × 2 = 2.59.
The inputs themselves are never rounded.

Overload is judged against the reported μ too, so the growth figure and the overload warning agree:
queue_growth_per_min = round(max(0, λ - μ) × 60, 2) with μ the reported max_throughput_per_s, and the
system counts as overloaded exactly when that figure is > 0.

Stdlib only: the CLI and the tests import this without the database or web stack.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

#: The reported figures, in display order; also the exact key set of `aivedio capacity estimate --json`.
FIGURES: tuple[str, ...] = (
    "in_flight",
    "required_slots",
    "max_throughput_per_s",
    "queue_growth_per_min",
    "polling_qps",
    "polling_qps_at_backlog",
    "fetch_mb_per_s",
    "fetch_gbit_per_s",
    "fetch_gbit_per_s_planned",
    "media_concurrency",
    "media_vcpu",
    "db_transition_writes_per_s",
    "sse_memory_gb",
)

UNITS: dict[str, str] = {
    "in_flight": "tasks",
    "required_slots": "slots",
    "max_throughput_per_s": "tasks/s",
    "queue_growth_per_min": "tasks/min",
    "polling_qps": "queries/s",
    "polling_qps_at_backlog": "queries/s",
    "fetch_mb_per_s": "MB/s",
    "fetch_gbit_per_s": "Gbit/s",
    "fetch_gbit_per_s_planned": "Gbit/s",
    "media_concurrency": "jobs",
    "media_vcpu": "vCPU",
    "db_transition_writes_per_s": "writes/s",
    "sse_memory_gb": "GB",
}


class CapacityInputError(ValueError):
    """One input is out of range; `field` is the input's name (the CLI option is the same, dashed)."""

    def __init__(self, field: str, requirement: str, value: object) -> None:
        self.field = field
        self.requirement = requirement
        self.value = value
        super().__init__(f"{field} {requirement}, got {value}")


@dataclass(frozen=True, slots=True)
class CapacityInputs:
    """Peak-hour assumptions. Defaults are the seed's example values, except backlog and connections (0)."""

    arrival_rate: float  # λ, tasks/s at peak
    avg_duration: float  # W, seconds a task holds a provider slot
    target_utilization: float = 0.75  # ρ: headroom kept on provider slots
    provider_slots: int | None = None  # C: total provider concurrency; None when unknown
    success_rate: float = 0.9
    output_mb: float = 60.0
    burst_factor: float = 2.0  # bursts and protocol overhead on the fetch link
    media_seconds: float = 45.0
    vcpu_per_media_job: float = 2.0
    transitions_per_task: float = 14.0
    poll_interval: float = 10.0
    backlog: int = 0  # tasks queued or running that the poller has to visit
    connections: int = 0  # concurrent SSE / WebSocket connections
    kb_per_connection: float = 20.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            # NaN slips through every comparison below, so reject it (and infinity) first.
            if value is not None and not math.isfinite(value):
                raise CapacityInputError(name, "must be a finite number", value)
        _check(self.arrival_rate > 0, "arrival_rate", "must be > 0", self.arrival_rate)
        _check(self.avg_duration > 0, "avg_duration", "must be > 0", self.avg_duration)
        _check(0 < self.target_utilization <= 1, "target_utilization", "must be in (0, 1]", self.target_utilization)
        _check(0 <= self.success_rate <= 1, "success_rate", "must be in [0, 1]", self.success_rate)
        _check(self.burst_factor >= 1, "burst_factor", "must be >= 1", self.burst_factor)
        _check(self.poll_interval > 0, "poll_interval", "must be > 0", self.poll_interval)
        for name in (
            "provider_slots",
            "output_mb",
            "media_seconds",
            "vcpu_per_media_job",
            "transitions_per_task",
            "backlog",
            "connections",
            "kb_per_connection",
        ):
            value = getattr(self, name)
            _check(value is None or value >= 0, name, "must be >= 0", value)


def _check(ok: bool, field: str, requirement: str, value: object) -> None:
    if not ok:
        raise CapacityInputError(field, requirement, value)


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """The 13 reported figures, each rounded to 2 decimals (see the module docstring)."""

    in_flight: float
    required_slots: float
    max_throughput_per_s: float | None  # None without provider slots
    queue_growth_per_min: float  # 0 when not overloaded or without provider slots
    polling_qps: float
    polling_qps_at_backlog: float
    fetch_mb_per_s: float
    fetch_gbit_per_s: float
    fetch_gbit_per_s_planned: float
    media_concurrency: float
    media_vcpu: float
    db_transition_writes_per_s: float
    sse_memory_gb: float

    @property
    def overloaded(self) -> bool:
        return self.queue_growth_per_min > 0

    def figures(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in FIGURES}


def _r(x: float) -> float:
    # float() first: round() of an int stays an int, and JSON consumers want one type per key.
    return round(float(x), 2)


def estimate(inputs: CapacityInputs) -> CapacityEstimate:
    i = inputs
    in_flight = _r(i.arrival_rate * i.avg_duration)
    mu = None if i.provider_slots is None else _r(i.provider_slots / i.avg_duration)
    fetch_mb = _r(i.arrival_rate * i.success_rate * i.output_mb)
    fetch_gbit = _r(fetch_mb * 8 / 1000)
    media = _r(i.arrival_rate * i.success_rate * i.media_seconds)
    return CapacityEstimate(
        in_flight=in_flight,
        required_slots=_r(in_flight / i.target_utilization),
        max_throughput_per_s=mu,
        queue_growth_per_min=0.0 if mu is None else _r(max(0.0, i.arrival_rate - mu) * 60),
        polling_qps=_r(in_flight / i.poll_interval),
        polling_qps_at_backlog=_r(i.backlog / i.poll_interval),
        fetch_mb_per_s=fetch_mb,
        fetch_gbit_per_s=fetch_gbit,
        fetch_gbit_per_s_planned=_r(fetch_gbit * i.burst_factor),
        media_concurrency=media,
        media_vcpu=_r(media * i.vcpu_per_media_job),
        db_transition_writes_per_s=_r(i.arrival_rate * i.transitions_per_task),
        sse_memory_gb=_r(i.connections * i.kb_per_connection / 1_000_000),
    )


def fmt(x: float | None) -> str:
    """No trailing zeros, thousands separated: 100,000 / 2.22 / 1.3.

    Six decimals, not two: figures are already rounded, but an input such as λ = 0.001 must not print as 0.
    """
    if x is None:
        return "n/a"
    return f"{x:,.6f}".rstrip("0").rstrip(".")


def explain(est: CapacityEstimate, inputs: CapacityInputs) -> list[tuple[str, float | None, str]]:
    """(figure, value, how it was computed with the actual numbers), one per figure, in FIGURES order."""
    i, e, f = inputs, est, fmt
    if e.max_throughput_per_s is None:
        mu = "unknown: no --provider-slots given"
        growth = "unknown without --provider-slots (reported as 0)"
    else:
        mu = f"μ = C / W = {f(i.provider_slots)} / {f(i.avg_duration)} = {f(e.max_throughput_per_s)} tasks/s"
        if e.overloaded:
            growth = (
                f"(λ − μ) × 60 = ({f(i.arrival_rate)} − {f(e.max_throughput_per_s)}) × 60"
                f" = {f(e.queue_growth_per_min)} tasks/min"
            )
        else:
            growth = f"λ = {f(i.arrival_rate)} ≤ μ = {f(e.max_throughput_per_s)}: the queue does not grow"
    lines = {
        "in_flight": f"L = λ × W = {f(i.arrival_rate)} × {f(i.avg_duration)} = {f(e.in_flight)} (Little's law)",
        "required_slots": (
            f"L / ρ = {f(e.in_flight)} / {f(i.target_utilization)} = {f(e.required_slots)}"
            f" slots at {f(i.target_utilization * 100)}% utilization"
        ),
        "max_throughput_per_s": mu,
        "queue_growth_per_min": growth,
        "polling_qps": f"L / poll interval = {f(e.in_flight)} / {f(i.poll_interval)} s = {f(e.polling_qps)}",
        "polling_qps_at_backlog": (
            f"backlog / poll interval = {f(i.backlog)} / {f(i.poll_interval)} s = {f(e.polling_qps_at_backlog)}"
        ),
        "fetch_mb_per_s": (
            f"λ × success × size = {f(i.arrival_rate)} × {f(i.success_rate)} × {f(i.output_mb)} MB"
            f" = {f(e.fetch_mb_per_s)} MB/s"
        ),
        "fetch_gbit_per_s": f"{f(e.fetch_mb_per_s)} MB/s × 8 / 1000 = {f(e.fetch_gbit_per_s)} Gbit/s",
        "fetch_gbit_per_s_planned": (
            f"{f(e.fetch_gbit_per_s)} Gbit/s × burst {f(i.burst_factor)}"
            f" = {f(e.fetch_gbit_per_s_planned)} Gbit/s (bursts, protocol overhead)"
        ),
        "media_concurrency": (
            f"λ × success × media time = {f(i.arrival_rate)} × {f(i.success_rate)}"
            f" × {f(i.media_seconds)} s = {f(e.media_concurrency)} jobs running"
        ),
        "media_vcpu": (
            f"{f(e.media_concurrency)} jobs × {f(i.vcpu_per_media_job)} vCPU = {f(e.media_vcpu)} vCPU,"
            " before redundancy and retries"
        ),
        "db_transition_writes_per_s": (
            f"λ × transitions = {f(i.arrival_rate)} × {f(i.transitions_per_task)}"
            f" = {f(e.db_transition_writes_per_s)} writes/s"
        ),
        "sse_memory_gb": (
            f"{f(i.connections)} connections × {f(i.kb_per_connection)} KB / 10^6"
            f" = {f(e.sse_memory_gb)} GB, before TLS and socket buffers"
        ),
    }
    return [(name, getattr(est, name), lines[name]) for name in FIGURES]


def overload_warning(est: CapacityEstimate, inputs: CapacityInputs) -> str | None:
    """One line when the queue grows: by how much, and how many provider slots are missing."""
    if not est.overloaded or inputs.provider_slots is None:
        return None
    c = inputs.provider_slots
    # max(0, ...): near the boundary the rounded μ can call a system overloaded that just fits.
    for_target = max(0, math.ceil(est.required_slots - c))
    to_keep_up = max(0, math.ceil(est.in_flight - c))
    return (
        f"overloaded: the queue grows by {fmt(est.queue_growth_per_min)} tasks/min;"
        f" {for_target} more provider slots needed for {fmt(est.required_slots)} at"
        f" {fmt(inputs.target_utilization * 100)}% utilization ({to_keep_up} just to keep up)"
    )
