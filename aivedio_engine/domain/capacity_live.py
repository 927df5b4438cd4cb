"""`capacity live`, pure: the model (domain/capacity.py) fed with rates measured over a window.

The service measures (services/capacity_live.py); this module turns the measurements into model inputs, runs
`capacity.estimate`, and adds what an operator on call asks first: how much room is left on the provider slots
right now, and — when work arrives faster than the slots can finish it — how long until they are all taken and
how fast the queue grows after that.

Time to saturation uses the fluid form of Little's law: with x tasks holding slots, each for W seconds on
average, slots free up at x / W per second while new work takes them at λ, so dx/dt = λ − x / W and
x(t) = λW + (x₀ − λW)·e^(−t/W). The slots saturate (x = C) only if λW > C, after
t = W · ln((λW − x₀) / (λW − C)). From then on the queue grows at λ − C / W (the model's queue growth).

A figure nobody measured in the window is not invented silently: the model's default is used and the input is
listed as "assumed", so the output says which numbers are facts and which are the seed's assumptions.
Stdlib only, like capacity.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from aivedio_engine.domain.capacity import CapacityEstimate, CapacityInputs, estimate
from aivedio_engine.domain.durations import parse_seconds

MAX_WINDOW_S = 30 * 86400  # a month: beyond that the "current" rates describe another system
_DEFAULTS = {f.name: f.default for f in fields(CapacityInputs)}


def parse_window(text: str) -> float:
    """ "90s", "15m", "1h", "2d" or plain seconds → seconds; ValueError says what is accepted."""
    try:
        seconds = parse_seconds(text)
    except ValueError:
        raise ValueError(f"window must look like 90s, 15m, 1h or 2d, got {text!r}") from None
    if not 0 < seconds <= MAX_WINDOW_S:
        raise ValueError(f"window must be > 0 and at most {MAX_WINDOW_S // 86400} days, got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Measured:
    """What the database says about one window (and about now, for in_flight and backlog).

    Means are None when the window holds no sample of them; the counts say how many samples there were.
    """

    window_s: float
    arrivals: int = 0  # tasks created in the window
    provider_seconds: float | None = None  # mean submit → provider success, of attempts that succeeded
    provider_samples: int = 0
    finished: int = 0  # tasks that reached a terminal state in the window
    succeeded: int = 0  # of those, SUCCEEDED
    output_bytes: float | None = None  # mean size of the raw outputs stored in the window
    outputs: int = 0
    media_seconds: float | None = None  # mean POST_PROCESSING → next state
    media_samples: int = 0
    transitions_per_task: float | None = None  # applied transitions per task finished in the window
    in_flight: int = 0  # attempts holding a provider slot now
    backlog: int = 0  # tasks waiting for a slot now (QUEUED, RETRY_WAIT)

    @property
    def arrival_rate(self) -> float:
        return self.arrivals / self.window_s

    @property
    def success_rate(self) -> float | None:
        return None if self.finished == 0 else self.succeeded / self.finished


@dataclass(frozen=True, slots=True)
class Saturation:
    """Slot pressure of one pool (one provider, or the platform)."""

    slots: int | None  # C; None when no limit is configured for this pool
    in_flight: int
    arrival_rate: float  # λ, tasks/s
    avg_duration: float | None  # W, s
    utilization: float | None  # λW / C, the steady-state share of slots in use
    headroom_slots: int | None  # C − in_flight, now
    headroom_rate: float | None  # extra tasks/s the pool absorbs before reaching the target utilization
    queue_growth_per_min: float  # (λ − C/W) × 60 once saturated, else 0
    time_to_saturation_s: float | None  # 0: saturated now; None: never at these rates, or unknown


def saturation(
    arrival_rate: float, avg_duration: float | None, slots: int | None, in_flight: int, target_utilization: float = 0.75
) -> Saturation:
    if slots is None or avg_duration is None or avg_duration <= 0:
        return Saturation(
            slots,
            in_flight,
            arrival_rate,
            avg_duration,
            None,
            None if slots is None else slots - in_flight,
            None,
            0.0,
            0.0 if slots is not None and in_flight >= slots else None,
        )
    load = arrival_rate * avg_duration  # L = λW: slots the steady state needs
    # μ rounded as capacity.estimate reports it, so this growth and the model's queue_growth_per_min agree
    mu = round(slots / avg_duration, 2)
    growth = round(max(0.0, arrival_rate - mu) * 60, 2)
    if in_flight >= slots:
        to_saturation: float | None = 0.0
    elif load > slots:
        to_saturation = round(avg_duration * math.log((load - in_flight) / (load - slots)), 1)
    else:
        to_saturation = None
    return Saturation(
        slots=slots,
        in_flight=in_flight,
        arrival_rate=arrival_rate,
        avg_duration=avg_duration,
        utilization=round(load / slots, 4) if slots else None,
        headroom_slots=slots - in_flight,
        headroom_rate=round(target_utilization * slots / avg_duration - arrival_rate, 4),
        queue_growth_per_min=growth,
        time_to_saturation_s=to_saturation,
    )


@dataclass(frozen=True, slots=True)
class SlotLimits:
    """providers.*.max_concurrency of the enabled providers, and limits.platform_max_concurrency."""

    providers: Mapping[str, int]
    platform: int

    @property
    def total(self) -> int:
        """The platform cap binds when the providers together could hold more."""
        return min(sum(self.providers.values()), self.platform)


@dataclass(frozen=True)
class LiveReport:
    measured: Measured
    inputs: CapacityInputs | None  # None: nothing arrived, or no provider duration measured yet
    estimate: CapacityEstimate | None
    assumed: tuple[str, ...]  # model inputs that were not measured in the window (defaults used)
    platform: Saturation
    providers: dict[str, Saturation] = field(default_factory=dict)
    why_no_estimate: str | None = None


def live_inputs(
    m: Measured, slots: int, *, poll_interval: float, target_utilization: float = 0.75
) -> tuple[CapacityInputs | None, tuple[str, ...], str | None]:
    """The model inputs from the measurements: (inputs or None, assumed input names, why None)."""
    if m.arrivals == 0:
        return None, (), "no task arrived in the window"
    if m.provider_seconds is None or m.provider_seconds <= 0:
        return None, (), "no provider run finished in the window: W (avg duration) is unknown"
    measured: dict[str, float | None] = {
        "success_rate": m.success_rate,
        "output_mb": None if m.output_bytes is None else m.output_bytes / 1_000_000,
        "media_seconds": m.media_seconds,
        "transitions_per_task": m.transitions_per_task,
    }
    assumed = tuple(name for name, value in measured.items() if value is None)
    chosen: dict[str, Any] = {name: (_DEFAULTS[name] if value is None else value) for name, value in measured.items()}
    inputs = CapacityInputs(
        arrival_rate=m.arrival_rate,
        avg_duration=m.provider_seconds,
        target_utilization=target_utilization,
        provider_slots=slots,
        poll_interval=poll_interval,
        backlog=m.in_flight + m.backlog,
        **chosen,
    )
    return inputs, assumed, None


def assess(
    m: Measured,
    limits: SlotLimits,
    *,
    poll_interval: float,
    target_utilization: float = 0.75,
    per_provider: Mapping[str, Measured] | None = None,
) -> LiveReport:
    """The whole picture: the model on measured rates, and slot pressure for the platform and each provider."""
    inputs, assumed, why = live_inputs(
        m, limits.total, poll_interval=poll_interval, target_utilization=target_utilization
    )
    providers: dict[str, Saturation] = {}
    for name in sorted(set(limits.providers) | set(per_provider or {})):
        pm = (per_provider or {}).get(name) or Measured(window_s=m.window_s)
        providers[name] = saturation(
            pm.arrival_rate, pm.provider_seconds, limits.providers.get(name), pm.in_flight, target_utilization
        )
    return LiveReport(
        measured=m,
        inputs=inputs,
        estimate=None if inputs is None else estimate(inputs),
        assumed=assumed,
        platform=saturation(m.arrival_rate, m.provider_seconds, limits.total, m.in_flight, target_utilization),
        providers=providers,
        why_no_estimate=why,
    )


def pressure_warnings(report: LiveReport) -> list[str]:
    """One line per pool whose slots are or will be exhausted at the measured rates: providers first, since tasks
    are pinned to their provider and one can saturate while the platform total still looks roomy."""
    lines = []
    for name, s in [*report.providers.items(), ("platform", report.platform)]:
        if s.time_to_saturation_s is None:
            continue
        when = (
            "saturated now"
            if s.time_to_saturation_s <= 0
            else f"slots saturate in {fmt_duration(s.time_to_saturation_s)} at the measured rates"
        )
        then = "" if s.time_to_saturation_s <= 0 else " then"
        growth = f"; the queue{then} grows by {s.queue_growth_per_min:g} tasks/min" if s.queue_growth_per_min else ""
        lines.append(f"{name}: {when} ({s.in_flight}/{s.slots} slots in use){growth}")
    return lines


def fmt_duration(seconds: float | None) -> str:
    """How an operator reads a time to saturation: "now", "never", "42s", "12m 5s", "3h 20m"."""
    if seconds is None:
        return "never"
    if seconds <= 0:
        return "now"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"
