"""Capacity: the model fed with rates measured over a window (`aivedio capacity live`)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from aivedio_engine.domain.capacity import UNITS, explain, fmt, overload_warning
from aivedio_engine.domain.capacity_live import (
    LiveReport,
    fmt_duration,
    pressure_warnings,
)
from tui.screens.base import OpsScreen

WINDOWS = (("15m", 900.0), ("1h", 3600.0), ("6h", 21600.0), ("24h", 86400.0))


def _opt(value: float | None, suffix: str = "") -> str:
    return "n/a" if value is None else f"{fmt(round(value, 4))}{suffix}"


def _table(id_: str, title: str, *columns: str) -> DataTable[Any]:
    table: DataTable[Any] = DataTable(id=id_, cursor_type="none", zebra_stripes=True)
    for c in columns:
        table.add_column(c, key=c)
    table.border_title = title
    return table


class CapacityScreen(OpsScreen):
    NAME = "Capacity"
    BINDINGS = [Binding("n", "window", "Next window")]

    def __init__(self) -> None:
        super().__init__()
        self.window = 1  # 1h
        self.report: LiveReport | None = None

    def compose_body(self) -> ComposeResult:
        with Vertical(id="capacity-body"):
            yield _table("measured", "Measured", "measured", "value", "samples")
            yield _table(
                "slots",
                "Provider slots",
                "pool",
                "slots",
                "in flight",
                "headroom",
                "utilization",
                "spare rate",
                "queue growth",
                "saturation in",
            )
            yield _table("model", "Capacity model on measured rates", "figure", "value", "unit")
            yield Static("", id="capacity-notes")

    def action_window(self) -> None:
        self.window = (self.window + 1) % len(WINDOWS)
        self.reload()

    def fetch(self) -> tuple[str, LiveReport]:
        name, seconds = WINDOWS[self.window]
        return name, self.ops.data.capacity(seconds)

    def show(self, data: tuple[str, LiveReport]) -> None:
        window, r = data
        self.report = r
        m = r.measured
        self.fill(
            self.query_one("#measured", DataTable),
            [
                (k, v)
                for k, v in (
                    ("rate", ("arrival rate λ", f"{_opt(m.arrival_rate)} tasks/s", str(m.arrivals))),
                    ("w", ("provider time W", _opt(m.provider_seconds, " s"), str(m.provider_samples))),
                    ("success", ("success rate", _opt(m.success_rate), str(m.finished))),
                    (
                        "size",
                        (
                            "raw output size",
                            _opt(None if m.output_bytes is None else m.output_bytes / 1e6, " MB"),
                            str(m.outputs),
                        ),
                    ),
                    ("media", ("media time", _opt(m.media_seconds, " s"), str(m.media_samples))),
                    ("transitions", ("transitions per task", _opt(m.transitions_per_task), str(m.finished))),
                    ("in_flight", ("slots in use now", str(m.in_flight), "")),
                    ("backlog", ("waiting for a slot now", str(m.backlog), "")),
                )
            ],
        )
        self.fill(
            self.query_one("#slots", DataTable),
            [
                (
                    name,
                    (
                        name,
                        _opt(s.slots),
                        str(s.in_flight),
                        _opt(s.headroom_slots),
                        _opt(None if s.utilization is None else s.utilization * 100, "%"),
                        _opt(s.headroom_rate, " tasks/s"),
                        f"{fmt(s.queue_growth_per_min)}/min",
                        "unknown"
                        if s.time_to_saturation_s is None and (s.slots is None or s.avg_duration is None)
                        else fmt_duration(s.time_to_saturation_s),
                    ),
                )
                for name, s in [*r.providers.items(), ("platform", r.platform)]
            ],
        )
        notes: list[str] = list(pressure_warnings(r))
        if r.estimate is None or r.inputs is None:
            self.fill(self.query_one("#model", DataTable), [])
            notes.insert(0, f"no model estimate: {r.why_no_estimate}")
        else:
            self.fill(
                self.query_one("#model", DataTable),
                [(name, (name, fmt(value), UNITS[name])) for name, value, _how in explain(r.estimate, r.inputs)],
            )
            if r.assumed:
                notes.append(f"assumed (not measured in the window): {', '.join(r.assumed)}")
            warning = overload_warning(r.estimate, r.inputs)
            if warning:
                notes.append(warning)
        self.query_one("#capacity-notes", Static).update("\n".join(notes))
        self.set_status(f"window {window} (w: next window) · {m.arrivals} arrivals, {m.finished} finished")
