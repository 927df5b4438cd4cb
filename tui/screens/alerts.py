"""Alerts: what the engine raised for a human (parked tasks, cost risks, threshold rules), newest first, through
`AlertOps` (the service of `aivedio alerts`). `k` acknowledges ("someone is on it"), `x` resolves; `Space` marks
rows so one confirmation acts on all of them (k9s multi-select)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from aivedio_engine.services.alert_ops import AlertView
from tui.data import AlertQuery
from tui.mutation import Mutation
from tui.screens.base import OpsScreen

#: ids listed in a confirmation before "… and N more" (the count is always exact)
SAMPLE = 10
MARK = "✓"
MARKED = "bold magenta"
SEVERITY = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def _subject(a: AlertView) -> str:
    if a.subject_type and a.subject_id:
        return f"{a.subject_type} {a.subject_id}"
    return a.subject_id or a.subject_type or ""


class AlertsScreen(OpsScreen):
    NAME = "Alerts"
    FILTER_HINT = (
        "filter: status:unresolved|open|acknowledged|resolved|all, severity:…, rule:…; other words must "
        "appear in a row; empty clears"
    )
    MUTATIONS = frozenset({"acknowledge", "resolve"})
    BINDINGS = [
        Binding("space", "mark", "Mark/unmark (moves down)"),
        Binding("k", "acknowledge", "Acknowledge"),
        Binding("x", "resolve", "Resolve"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.alerts: list[AlertView] = []
        #: row keys (alert ids) marked with Space; k/x act on these when there are any
        self.marked: set[str] = set()
        self._pending: str | None = None

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="alerts", cursor_type="row", zebra_stripes=True)
        for label, key in (
            (MARK, "mark"),
            ("raised", "raised"),
            ("severity", "severity"),
            ("rule", "rule"),
            ("status", "status"),
            ("subject", "subject"),
            ("message", "message"),
            ("acknowledged by", "by"),
        ):
            table.add_column(label, key=key)
        table.border_title = "Unresolved alerts, newest first (Space marks)"
        yield table

    def highlight(self, alert_id: uuid.UUID) -> None:
        """Put the cursor on `alert_id` (now, or when the load that lists it lands)."""
        self._pending = str(alert_id)
        if self.alerts:  # else not even composed yet: `show` applies it
            self._apply_pending()

    def _apply_pending(self) -> None:
        table = self.query_one("#alerts", DataTable)
        keys = [str(a.id) for a in self.alerts]
        if self._pending in keys:
            table.move_cursor(row=keys.index(self._pending))
            self._pending = None

    # --- loading ----------------------------------------------------------------------------------------------

    def fetch(self) -> tuple[AlertQuery, list[AlertView]]:
        query = AlertQuery.parse(self.filter_text)
        return query, self.ops.data.alerts(query)

    def show(self, data: tuple[AlertQuery, list[AlertView]]) -> None:
        query, alerts = data
        self.alerts = alerts
        self.marked &= {str(a.id) for a in alerts}
        self._fill_rows()
        self._apply_pending()
        self._pending = None  # not listed (filtered out, resolved meanwhile): no cursor jump on a later load
        table = self.query_one("#alerts", DataTable)
        table.border_title = f"{query.status.capitalize()} alerts, newest first (Space marks)"
        self.set_status(self._status_text())

    def _fill_rows(self) -> None:
        self.fill(self.query_one("#alerts", DataTable), [(str(a.id), self._cells(a)) for a in self.alerts])

    def _cells(self, a: AlertView) -> tuple[Any, ...]:
        marked = str(a.id) in self.marked
        cells: list[Any] = [
            MARK if marked else "",
            a.raised_at.strftime("%m-%d %H:%M:%S"),
            Text(a.severity, style=SEVERITY.get(a.severity, "")),
            a.rule,
            a.status,
            _subject(a),
            a.message[:80],
            a.acknowledged_by or "",
        ]
        if marked:
            cells = [Text(c, style=MARKED) if isinstance(c, str) else Text(c.plain, style=MARKED) for c in cells]
        return tuple(cells)

    def _status_text(self) -> str:
        text = self.status_for(len(self.alerts), "alerts")
        if self.marked:
            text += f" · {len(self.marked)} marked: k/x act on them"
        return text

    # --- marks ------------------------------------------------------------------------------------------------

    def current(self) -> AlertView | None:
        key = self.selected_key(self.query_one("#alerts", DataTable))
        return next((a for a in self.alerts if str(a.id) == key), None)

    def action_mark(self) -> None:
        alert = self.current()
        if alert is None:
            return
        key = str(alert.id)
        self.marked ^= {key}
        table = self.query_one("#alerts", DataTable)
        for column, value in zip(table.columns, self._cells(alert), strict=True):
            table.update_cell(key, column, value)
        table.action_cursor_down()
        self.set_status(self._status_text())

    def chosen(self) -> list[AlertView]:
        """The marked alerts (in list order), else the highlighted one."""
        if self.marked:
            return [a for a in self.alerts if str(a.id) in self.marked]
        alert = self.current()
        return [alert] if alert is not None else []

    def _unmark(self, ids: Sequence[uuid.UUID]) -> None:
        self.marked -= {str(i) for i in ids}

    # --- actions ----------------------------------------------------------------------------------------------

    def action_acknowledge(self) -> None:
        data = self.ops.data
        self._act(
            "acknowledge",
            "acknowledged",
            ("OPEN",),
            lambda ids, op: data.acknowledge(ids, op),
            "they stay listed as ACKNOWLEDGED by you; a repeat of the condition pages nobody again",
        )

    def action_resolve(self) -> None:
        data = self.ops.data
        self._act(
            "resolve",
            "resolved",
            ("OPEN", "ACKNOWLEDGED"),
            lambda ids, op: data.resolve(ids, op),
            "they leave the list; if the condition still holds the engine raises a fresh alert",
        )

    def _act(
        self,
        verb: str,
        done: str,
        allowed: tuple[str, ...],
        call: Callable[[Sequence[uuid.UUID], Any], str],
        effect: str,
    ) -> None:
        chosen = self.chosen()
        if not chosen:
            return
        ids = [a.id for a in chosen]
        lines = [f"{len(ids)} alert(s) will be {done}{' (the marked ones)' if self.marked else ''}:"]
        lines += [f"  {a.id}  {a.severity:<8} {a.rule}  ({a.status})" for a in chosen[:SAMPLE]]
        if len(chosen) > SAMPLE:
            lines.append(f"  … and {len(chosen) - SAMPLE} more")
        left = [a for a in chosen if a.status not in allowed]
        if left:
            lines.append(
                f"{len(left)} of them are already {', '.join(sorted({a.status for a in left}))}: left as they are"
            )
        lines.append(effect)

        def run(op: Any) -> str:
            message = call(ids, op)
            self.app.call_from_thread(self._unmark, ids)  # done: the marks served their purpose
            return message

        self.mutate(
            Mutation(
                command=f"tui alerts {verb}",
                title=f"{verb.capitalize()} {len(ids)} alert(s)",
                lines=lines,
                run=run,
                args={"ids": [str(i) for i in ids]},
            )
        )
