"""Audit: the invariant checks of `aivedio audit` (services/invariants.py), run in a worker, one row per check;
the highlighted violated check's offending rows below. Read-only: `r` runs the checks again.

The checks read every table, so they run when the screen is first shown and on `r`, not each time it is shown
again (the `/` filter only narrows the rows of the last run).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.markup import escape
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable

from aivedio_engine.services.invariants import CheckResult, Skipped
from tui.data import AuditRun, fmt_age
from tui.screens.base import OpsScreen

OK = Text("ok", style="green")
SKIPPED = Text("skipped", style="dim")


def _status(check: CheckResult | Skipped) -> Text:
    if isinstance(check, Skipped):
        return SKIPPED
    return OK if check.ok else Text(f"VIOLATED ({check.violations})", style="bold red")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, Decimal):
        return format(value, "f")  # a zero balance reads 0.00000000, not 0E-8
    return str(value)[:100]


class AuditScreen(OpsScreen):
    NAME = "Audit"
    FILTER_HINT = (
        "filter: words that must appear in a check's id, status or invariant (e.g. violated, I4); empty clears"
    )
    BINDINGS = [Binding("r", "reload", "Run the checks again")]

    def __init__(self) -> None:
        super().__init__()
        self.audit_run: AuditRun | None = None
        self.checks: dict[str, CheckResult | Skipped] = {}
        self.audit_running = False

    def compose_body(self) -> ComposeResult:
        with Vertical(id="audit-body"):
            checks: DataTable[Any] = DataTable(id="checks", cursor_type="row", zebra_stripes=True)
            for label, key in (
                ("check", "id"),
                ("status", "status"),
                ("invariant", "description"),
                ("why not checked", "why"),
            ):
                checks.add_column(label, key=key)
            checks.border_title = "Invariant checks (aivedio audit)"
            yield checks
            offending: DataTable[Any] = DataTable(id="offending", cursor_type="row", zebra_stripes=True)
            offending.border_title = "Offending rows"
            yield offending

    def resumed(self) -> None:
        if self.audit_run is None and not self.audit_running:
            self.action_reload()

    def action_reload(self) -> None:
        self.audit_running = True
        self.set_status("running the invariant checks…")
        self.reload()

    def filter_changed(self) -> None:
        if self.audit_run is not None:
            self.show(self.audit_run)

    def fetch(self) -> AuditRun:
        return self.ops.data.audit()

    def _failed(self, message: str) -> None:
        self.audit_running = False
        super()._failed(message)

    def show(self, run: AuditRun) -> None:
        first = self.audit_run is None
        self.audit_run, self.audit_running = run, False
        report = run.report
        every: list[CheckResult | Skipped] = [*report.results, *report.skipped]
        words = self.filter_text.lower().split()
        shown = [c for c in every if all(w in f"{c.id} {_status(c)} {c.description}".lower() for w in words)]
        self.checks = {c.id: c for c in shown}
        table = self.query_one("#checks", DataTable)
        self.fill(
            table, [(c.id, (c.id, _status(c), c.description, c.why if isinstance(c, Skipped) else "")) for c in shown]
        )
        violated = [c.id for c in shown if isinstance(c, CheckResult) and not c.ok]
        if first and violated:  # straight to the first problem
            table.move_cursor(row=[c.id for c in shown].index(violated[0]))
        failed = sum(1 for r in report.results if not r.ok)
        verdict = "all checks hold" if failed == 0 else f"[b red]{failed} of {len(report.results)} checks violated[/]"
        self.set_status(
            f"{verdict}; {len(report.skipped)} not checked here · ran {run.at:%H:%M:%S} UTC · grace "
            f"{fmt_age(run.grace_s)} · r runs them again"
            + (f" · {len(shown)} shown · filter: {escape(self.filter_text)}" if self.filter_text else "")
        )
        self._check_highlighted()

    @on(DataTable.RowHighlighted, "#checks")
    def _check_highlighted(self) -> None:
        table = self.query_one("#offending", DataTable)
        table.clear(columns=True)
        check = self.checks.get(self.selected_key(self.query_one("#checks", DataTable)) or "")
        if check is None:
            table.border_title = "Offending rows"
        elif isinstance(check, Skipped):
            table.border_title = f"{check.id}: not checked here"
            table.add_column("why", key="why")
            table.add_row(check.why)
        elif check.ok:
            table.border_title = f"{check.id} holds: no offending rows"
        else:
            shown = (
                f"first {len(check.rows)} of {check.violations}"
                if len(check.rows) < check.violations
                else str(check.violations)
            )
            table.border_title = f"{check.id}: {shown} offending row(s)"
            for name in check.rows[0]:
                table.add_column(name, key=name)
            for row in check.rows:
                table.add_row(*(_cell(v) for v in row.values()))
