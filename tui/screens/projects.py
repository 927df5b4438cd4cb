"""Projects (System B): the list, newest first; Enter for one project's steps as a tree — status,
duration, cost, retries and error of each step, per-shot steps grouped under their step — with `r` to retry a
failed or manual_required step and `a` to approve a manual_required one (a reason is asked for; both go through
the same services as the API and the review queue, audited)."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static, Tree

from aivedio_engine.domain.project import base_key
from aivedio_engine.domain.workflow import StepStatus
from aivedio_engine.services.workflows import Project, ProjectView, Step
from tui.data import fmt_money
from tui.mutation import Mutation
from tui.screens.base import OpsScreen

STATUS_STYLE = {
    StepStatus.SUCCESS: "green",
    StepStatus.RUNNING: "bold cyan",
    StepStatus.RETRYING: "yellow",
    StepStatus.FAILED: "bold red",
    StepStatus.MANUAL_REQUIRED: "bold magenta",
    StepStatus.CANCELLED: "dim",
    StepStatus.PENDING: "dim",
}
RETRYABLE = frozenset({StepStatus.FAILED, StepStatus.MANUAL_REQUIRED})


def duration(s: Step, now: datetime) -> str:
    if s.started_at is None:
        return "-"
    seconds = ((s.finished_at or now) - s.started_at).total_seconds()
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def step_label(s: Step, now: datetime) -> Text:
    text = Text()
    text.append(f"{s.step_key:<14} ", style="bold")
    text.append(f"{s.status.value:<16}", style=STATUS_STYLE.get(s.status, ""))
    text.append(f" {duration(s, now):>7}  cost {fmt_money(s.cost_actual)}")
    if s.retry_count:
        text.append(f"  retries {s.retry_count}/{s.max_retry}", style="yellow")
    if s.error_code:
        text.append(f"  {s.error_code}: {s.error_message or ''}"[:120], style="red")
    return text


class ProjectsScreen(OpsScreen):
    NAME = "Projects"
    FILTER_HINT = "filter: words match status, workflow, user, id; empty clears"
    BINDINGS = [Binding("enter", "open", "Steps", show=False)]

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[Project] = []

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="projects", cursor_type="row", zebra_stripes=True)
        for label, key in (
            ("project", "id"),
            ("workflow", "workflow"),
            ("user", "user"),
            ("status", "status"),
            ("prio", "priority"),
            ("cost", "cost"),
            ("updated", "updated"),
        ):
            table.add_column(label, key=key)
        table.border_title = "Projects, newest first (Enter: steps)"
        yield table

    def fetch(self) -> list[Project]:
        words = self.filter_text.lower().split()
        projects = self.ops.data.projects()
        return [p for p in projects if all(w in f"{p.status} {p.workflow} {p.user_ref} {p.id}".lower() for w in words)]

    def show(self, rows: list[Project]) -> None:
        self.rows = rows
        self.fill(
            self.query_one("#projects", DataTable),
            [
                (
                    str(p.id),
                    (
                        str(p.id),
                        p.workflow,
                        p.user_ref,
                        p.status.value,
                        str(p.priority),
                        fmt_money(p.cost_actual),
                        p.updated_at.strftime("%m-%d %H:%M:%S"),
                    ),
                )
                for p in rows
            ],
        )
        self.set_status(self.status_for(len(rows), "projects"))

    @on(DataTable.RowSelected, "#projects")
    def action_open(self) -> None:
        key = self.selected_key(self.query_one("#projects", DataTable))
        if key is not None:
            self.app.push_screen(ProjectDetailScreen(uuid.UUID(key)))


class ProjectDetailScreen(OpsScreen):
    """One project: its header and its steps as a tree (`p` here retries the step under the cursor)."""

    NAME = "Project steps"
    MUTATIONS = frozenset({"retry", "approve"})
    BINDINGS = [
        Binding("p", "retry", "Retry step"),
        Binding("a", "approve", "Approve step"),
    ]

    def __init__(self, project_id: uuid.UUID) -> None:
        super().__init__()
        self.project_id = project_id
        self.view: ProjectView | None = None

    def compose_body(self) -> ComposeResult:
        yield Static("", id="project-header")
        tree: Tree[str] = Tree("steps", id="steps")
        tree.show_root = False
        tree.border_title = "Steps (p retry, a approve, Esc back)"
        yield tree

    def on_mount(self) -> None:
        super().on_mount()
        self.title = f"aivedio · project {self.project_id}"

    def fetch(self) -> ProjectView:
        return self.ops.data.project(self.project_id)

    def show(self, view: ProjectView) -> None:
        self.view = view
        p, now = view.project, self.ops.data.ctx.clock.now()
        total = sum((s.cost_actual for s in view.steps), Decimal(0))
        header = Text()
        header.append(f"{p.id}  ", style="bold")
        header.append(f"{p.status.value}\n", style="bold reverse")
        for name, value in (
            ("workflow", p.workflow),
            ("user", p.user_ref),
            ("priority", p.priority),
            ("formal", p.formal),
            ("shots", p.shots),
            ("cost", f"{fmt_money(total)} of {fmt_money(p.cost_estimate)} estimated"),
        ):
            header.append(f"{name}: ", style="dim")
            header.append(f"{value}   ")
        self.query_one("#project-header", Static).update(header)

        tree: Tree[str] = self.query_one("#steps", Tree)
        keep = self.selected_step()
        tree.clear()
        groups: dict[str, list[Step]] = {}
        for s in view.steps:
            groups.setdefault(base_key(s.step_key), []).append(s)
        for name, steps in groups.items():
            if len(steps) == 1 and steps[0].step_key == name:
                tree.root.add_leaf(step_label(steps[0], now), data=name)
                continue
            done = sum(s.status is StepStatus.SUCCESS for s in steps)
            parent = tree.root.add(Text(f"{name}[]  {done}/{len(steps)} done", style="bold"), expand=True)
            for s in steps:
                parent.add_leaf(step_label(s, now), data=s.step_key)
        if keep is not None:
            self.highlight(keep)
        self.set_status(f"{len(view.steps)} steps · {p.status.value}" + (" · read-only" if self.ops.readonly else ""))

    def highlight(self, step_key: str) -> None:
        tree: Tree[str] = self.query_one("#steps", Tree)
        for line in range(tree.last_line + 1):
            node = tree.get_node_at_line(line)
            if node is not None and node.data == step_key:
                tree.move_cursor(node)
                return

    def selected_step(self) -> str | None:
        node = self.query_one("#steps", Tree).cursor_node
        return None if node is None or node.data is None else str(node.data)

    def _step(self) -> Step | None:
        key = self.selected_step()
        if self.view is None or key is None:
            return None
        return next((s for s in self.view.steps if s.step_key == key), None)

    def action_retry(self) -> None:
        s = self._step()
        if s is None:
            return
        if s.status not in RETRYABLE:
            self.notify(f"step {s.step_key} is {s.status}: only failed or manual_required steps are retried")
            return
        data, pid = self.ops.data, self.project_id
        self.mutate(
            Mutation(
                command="tui projects retry-step",
                title=f"Retry step {s.step_key} of project {pid}",
                lines=[
                    f"step {s.step_key} is {s.status} ({s.error_code or 'no error code'})",
                    "it goes back to pending on the same row, with a fresh retry budget",
                ],
                run=lambda op: data.retry_step(pid, s.step_key, op),
                args={"project_id": str(pid), "step": s.step_key},
            )
        )

    def action_approve(self) -> None:
        s = self._step()
        if s is None:
            return
        if s.status is not StepStatus.MANUAL_REQUIRED:
            self.notify(f"step {s.step_key} is {s.status}: only a manual_required step can be approved")
            return
        data, pid = self.ops.data, self.project_id
        self.mutate(
            Mutation(
                command="tui projects approve-step",
                title=f"Approve step {s.step_key} of project {pid}",
                lines=[
                    f"step {s.step_key} waits for a person: {s.error_code}: {s.error_message or ''}",
                    "it becomes success as it is, its review item is closed and the project goes on",
                ],
                run=lambda op: data.approve_step(pid, s.step_key, op),
                args={"project_id": str(pid), "step": s.step_key},
            )
        )
