"""Tasks: the operator's list (most recently changed first), `/` to filter, Enter for one task's timeline."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from aivedio_engine.services.task_ops import TaskRow, Timeline
from tui.data import TaskQuery, fmt_money
from tui.mutation import Mutation
from tui.screens.base import OpsScreen

#: task fields shown under its id and status in the detail header, in plain words (empty ones are left out)
_HEADER_FIELDS = {
    "tenant_id": "tenant",
    "selected_provider": "provider",
    "requested_model": "model",
    "current_attempt_no": "attempt",
    "progress": "progress %",
    "reserved_amount": "credits held",
    "actual_cost": "cost",
    "review_state": "review",
    "parked_reason": "parked because",
    "last_error_class": "last error",
    "last_error_code": "error code",
    "cancel_outcome": "cancel",
    "created_at": "created",
    "updated_at": "changed",
    "finished_at": "finished",
    "version": "version",
}

#: timeline item kinds in plain words
_KINDS = {"state_event": "state change", "provider_event": "provider event", "outbox": "message"}


def cancel_mutation(data: Any, task_id: uuid.UUID, status: str) -> Mutation:
    return Mutation(
        command="tui tasks cancel",
        title=f"Cancel task {task_id}",
        lines=[
            f"task {task_id} is {status}",
            "an operator cancel: same decision and credit release as a client's cancel",
        ],
        run=lambda op: data.cancel(task_id, op),
        args={"task_id": str(task_id)},
    )


class TasksScreen(OpsScreen):
    NAME = "Tasks"
    FILTER_HINT = (
        "filter: status:QUEUED tenant:acme provider:sim (exact), other words match "
        "status/tenant/provider/model/id; empty clears"
    )
    MUTATIONS = frozenset({"cancel"})
    BINDINGS = [
        Binding("enter", "open", "Timeline", show=False),
        Binding("x", "cancel", "Cancel task"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[TaskRow] = []

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="tasks", cursor_type="row", zebra_stripes=True)
        for label, key in (
            ("task", "task_id"),
            ("tenant", "tenant"),
            ("status", "status"),
            ("provider", "provider"),
            ("model", "model"),
            ("att", "attempts"),
            ("%", "progress"),
            ("updated", "updated"),
            ("note", "note"),
        ):
            table.add_column(label, key=key)
        table.border_title = "Tasks, most recently changed first"
        yield table

    def fetch(self) -> list[TaskRow]:
        return self.ops.data.tasks(TaskQuery.parse(self.filter_text))

    def show(self, rows: list[TaskRow]) -> None:
        self.rows = rows
        self.fill(
            self.query_one("#tasks", DataTable),
            [
                (
                    str(r.task_id),
                    (
                        str(r.task_id),
                        r.tenant,
                        r.status,
                        r.provider or "-",
                        r.model,
                        str(r.attempts),
                        str(r.progress),
                        r.updated_at.strftime("%m-%d %H:%M:%S"),
                        r.parked_reason or r.last_error_class or "",
                    ),
                )
                for r in rows
            ],
        )
        self.set_status(self.status_for(len(rows), "tasks"))

    def _current(self) -> TaskRow | None:
        key = self.selected_key(self.query_one("#tasks", DataTable))
        return next((r for r in self.rows if str(r.task_id) == key), None)

    @on(DataTable.RowSelected, "#tasks")
    def action_open(self) -> None:
        row = self._current()
        if row is not None:
            self.app.push_screen(TaskDetailScreen(row.task_id))

    def action_cancel(self) -> None:
        row = self._current()
        if row is not None:
            self.mutate(cancel_mutation(self.ops.data, row.task_id, row.status))


class TaskDetailScreen(OpsScreen):
    """One task's story, merged by time (the same timeline as `aivedio tasks show`)."""

    NAME = "Task timeline"
    MUTATIONS = frozenset({"cancel"})
    BINDINGS = [Binding("x", "cancel", "Cancel task")]

    def __init__(self, task_id: uuid.UUID) -> None:
        super().__init__()
        self.task_id = task_id
        self.timeline: Timeline | None = None

    def compose_body(self) -> ComposeResult:
        yield Static("", id="task-header")
        table: DataTable[Any] = DataTable(id="timeline", cursor_type="row", zebra_stripes=True)
        for label, key in (("at", "at"), ("kind", "kind"), ("what", "what")):
            table.add_column(label, key=key)
        table.border_title = "Timeline (Esc: back)"
        yield table

    def on_mount(self) -> None:
        super().on_mount()
        self.title = f"aivedio · task {self.task_id}"

    def fetch(self) -> Timeline:
        return self.ops.data.timeline(self.task_id)

    def show(self, timeline: Timeline) -> None:
        self.timeline = timeline
        t = timeline.task
        header = Text()
        header.append(f"{t['task_id']}  ", style="bold")
        header.append(f"{t['status']}\n", style="bold reverse")
        for name, label in _HEADER_FIELDS.items():
            value = t.get(name)
            if value is None or value == "":
                continue
            if name in ("reserved_amount", "actual_cost"):
                shown = fmt_money(value)
            elif isinstance(value, datetime):
                shown = f"{value:%Y-%m-%d %H:%M:%S} UTC"
            else:
                shown = str(value)
            header.append(f"{label} ", style="dim")
            header.append(f"{shown}   ")
        self.query_one("#task-header", Static).update(header)
        self.fill(
            self.query_one("#timeline", DataTable),
            [
                (
                    str(i["id"]),
                    (i["at"].strftime("%m-%d %H:%M:%S.%f")[:-3], _KINDS.get(i["kind"], i["kind"]), summary(i)),
                )
                for i in timeline.items
            ],
        )
        self.set_status(f"{len(timeline.items)} timeline items · Esc back")

    def action_cancel(self) -> None:
        if self.timeline is not None:
            self.mutate(cancel_mutation(self.ops.data, self.task_id, self.timeline.task["status"]))


def summary(i: dict[str, Any]) -> str:
    """One line per timeline item: what an on-call engineer scans for."""
    k = i["kind"]
    if k == "state_event":
        move = f"{i['from_status'] or '∅'} → {i['to_status']}" if i["to_status"] else "(no change)"
        return f"{move}  {i['event_type']}  [{i['source']}, {i['outcome']}]"
    if k == "attempt":
        again = "  resubmitted after unknown" if i["resubmitted_after_unknown"] else ""
        return f"#{i['attempt_no']} {i['provider']} {i['submit_state']} job={i['provider_job_id'] or '-'}{again}"
    if k == "provider_event":
        match = "orphan" if i["orphan"] else "matched" if i["matched"] else "unmatched"
        return f"{i['source']} {i['status'] or '?'} job={i['provider_job_id'] or '-'} ({match})"
    if k == "ledger":
        return f"{i['entry_type']} {fmt_money(i['amount'])} {i['unit']}  {i['business_key']}"
    if k == "asset":
        dims = f" {i['width']}x{i['height']}" if i["width"] else ""
        return f"{i['asset_kind']}{'/' + i['profile'] if i['profile'] else ''} {i['status']}{dims}"
    if k == "review":
        decided = f" → {i['decision']} by {i['decided_by']}" if i["decision"] else ""
        return f"review {i['state']}: {i['reason']}{decided}"
    if k == "alert":
        return f"{i['severity']} {i['rule']} ({i['status']}): {i['message']}"
    error = f" error: {i['last_error']}" if i.get("last_error") else ""
    return f"{i['event_type']} → {i['target']} {i['status']}{error}"
