"""Overview: the live operational figures, re-read every few seconds in a worker; every panel comes from one
read of `OverviewService`.

Every count drills down: Tab moves between the panels, Enter on a count opens the list behind it — the Tasks
screen filtered the way the count was counted (`status:QUEUED`, `provider:sim`), the DLQ/orphans pile, the
ledger, or the highlighted alert on the Alerts screen (acknowledge, resolve)."""

from __future__ import annotations

import uuid
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.timer import Timer
from textual.widgets import DataTable

from tui.data import Overview, fmt_age, fmt_money
from tui.screens.base import OpsScreen

#: (row key, label) of the key-figures table, in display order
FIGURES = (
    ("queue_depth", "queued tasks"),
    ("queue_p95", "queue age p95"),
    ("queue_oldest", "oldest queued"),
    ("submit_unknown", "SUBMIT_UNKNOWN"),
    ("outbox_due", "outbox due"),
    ("outbox_oldest", "outbox oldest age"),
    ("dead_letters", "DLQ (not replayed)"),
    ("orphans", "orphan provider events"),
    ("reserved", "reserved credits"),
    ("reserved_age", "oldest reservation"),
    ("alerts", "open alerts (9: Alerts)"),
)
#: where Enter on a key figure goes: ("tasks", filter) or (app mode, pile)
DRILL: dict[str, tuple[str, str]] = {
    "queue_depth": ("tasks", "status:QUEUED"),
    "queue_p95": ("tasks", "status:QUEUED"),
    "queue_oldest": ("tasks", "status:QUEUED"),
    "submit_unknown": ("tasks", "status:SUBMIT_UNKNOWN"),
    "outbox_due": ("replay", "outbox"),
    "outbox_oldest": ("replay", "outbox"),
    "dead_letters": ("replay", "dlq"),
    "orphans": ("replay", "orphans"),
    "reserved": ("ledger", ""),
    "reserved_age": ("ledger", ""),
    "alerts": ("alerts", ""),
}


def _table(id_: str, *columns: tuple[str, str], cursor: str = "row") -> DataTable[Any]:
    table: DataTable[Any] = DataTable(id=id_, cursor_type=cursor, zebra_stripes=True)  # type: ignore[arg-type]
    for label, key in columns:
        table.add_column(label, key=key)
    return table


class OverviewScreen(OpsScreen):
    NAME = "Overview"
    BINDINGS = [
        Binding("f", "pause", "Freeze", tooltip="freeze or resume the live refresh"),
        Binding("enter", "drill", "Open the list behind the highlighted count (Tab: next panel)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self._timer: Timer | None = None
        self.overview: Overview | None = None

    def compose_body(self) -> ComposeResult:
        with Grid(id="overview-grid"):
            roles = _table(
                "roles",
                ("role", "role"),
                ("alive", "alive"),
                ("last seen", "seen"),
                ("waiting", "waiting"),
                ("processes", "where"),
                ("verdict", "verdict"),
                cursor="none",
            )
            roles.can_focus = False  # who runs: nothing to open behind it
            roles.border_title = "Engine roles (aivedio status)"
            yield roles
            states = _table("states", ("state", "state"), ("tasks", "tasks"))
            states.border_title = "Unfinished tasks by state"
            yield states
            figures = _table("figures", ("figure", "figure"), ("value", "value"))
            figures.border_title = "Key figures"
            yield figures
            providers = _table(
                "providers",
                ("provider", "provider"),
                ("active/limit", "active"),
                ("unknown", "unknown"),
                ("orphans", "orphans"),
                cursor="cell",
            )
            providers.border_title = "Providers"
            yield providers
            alerts = _table(
                "alerts", ("raised", "raised"), ("severity", "severity"), ("rule", "rule"), ("message", "message")
            )
            alerts.border_title = "Open alerts (Enter: Alerts screen)"
            yield alerts

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#alerts", DataTable).focus()  # the alerts are what to act on first; Tab reaches the counts
        if self.ops.refresh_s:
            self._timer = self.set_interval(self.ops.refresh_s, self._tick)

    def _tick(self) -> None:
        if not self.paused and self.is_current:
            self.reload()

    def action_drill(self) -> None:
        """Enter when no table has the focus (a table's own Enter sends the selection events below)."""
        self.query_one("#alerts", DataTable).focus()

    @on(DataTable.RowSelected, "#states")
    def _drill_state(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.ops.open_tasks(f"status:{event.row_key.value}")

    @on(DataTable.RowSelected, "#figures")
    def _drill_figure(self, event: DataTable.RowSelected) -> None:
        where, what = DRILL.get(str(event.row_key.value), ("", ""))
        if where == "tasks":
            self.ops.open_tasks(what)
        elif where == "replay":
            self.ops.open_pile(what)
        elif where:
            self.ops.action_goto(where)

    @on(DataTable.CellSelected, "#providers")
    def _drill_provider(self, event: DataTable.CellSelected) -> None:
        provider, column = event.cell_key.row_key.value, event.cell_key.column_key.value
        if column == "orphans":
            self.ops.open_pile("orphans")
        elif column == "unknown":
            self.ops.open_tasks(f"status:SUBMIT_UNKNOWN provider:{provider}")
        else:
            self.ops.open_tasks(f"provider:{provider}")

    @on(DataTable.RowSelected, "#alerts")
    def action_open_alert(self) -> None:
        key = self.selected_key(self.query_one("#alerts", DataTable))
        try:
            alert_id = uuid.UUID(key) if key else None
        except ValueError:
            alert_id = None
        self.ops.open_alert(alert_id)

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.notify("live refresh paused" if self.paused else "live refresh resumed")
        if self.overview is not None:
            self.set_status(self._status(self.overview))

    def fetch(self) -> Overview:
        return self.ops.data.overview()

    def show(self, o: Overview) -> None:
        self.overview = o
        self.fill(
            self.query_one("#roles", DataTable),
            [
                (r.role, (r.role, str(r.alive), fmt_age(r.last_seen_age_s), str(r.waiting), r.where or "-", r.verdict))
                for r in o.roles
            ],
        )
        self.fill(self.query_one("#states", DataTable), [(s, (s, str(n))) for s, n in o.by_status.items()])
        values = {
            "queue_depth": str(o.queue_depth),
            "queue_p95": fmt_age(o.queue_p95_age_s),
            "queue_oldest": fmt_age(o.queue_oldest_age_s),
            "submit_unknown": str(o.submit_unknown),
            "outbox_due": str(o.outbox_due),
            "outbox_oldest": fmt_age(o.outbox_oldest_age_s),
            "dead_letters": str(o.dead_letters),
            "orphans": str(o.orphans),
            "reserved": fmt_money(o.reserved_credits),
            "reserved_age": fmt_age(o.reserved_oldest_age_s),
            "alerts": str(len(o.alerts)),
        }
        self.fill(self.query_one("#figures", DataTable), [(k, (label, values[k])) for k, label in FIGURES])
        self.fill(
            self.query_one("#providers", DataTable),
            [
                (
                    p.name,
                    (p.name, f"{p.active}/{p.limit if p.limit is not None else '∞'}", str(p.unknown), str(p.orphans)),
                )
                for p in o.providers
            ],
        )
        self.fill(
            self.query_one("#alerts", DataTable),
            [
                (
                    str(a.id) if a.id else f"{i}",
                    (a.raised_at.strftime("%m-%d %H:%M:%S"), a.severity, a.rule, a.message[:120]),
                )
                for i, a in enumerate(o.alerts)
            ],
        )
        self.set_status(self._status(o))

    def _status(self, o: Overview) -> str:
        live = "paused" if self.paused else (f"every {self.ops.refresh_s:g}s" if self.ops.refresh_s else "off")
        text = f"{sum(o.by_status.values())} unfinished tasks · as of {o.now:%H:%M:%S} UTC · live refresh {live}"
        return text + (" · read-only" if self.ops.readonly else "")
