"""`aivedio tui`: the operator's dashboard, with k9s keys.

Each top-level screen is a Textual mode, so switching with a digit (or `:` name) keeps every screen's cursor,
filter and pushed detail screens; Esc pops a detail screen, else returns to the previously visited screen.

`mutate()` is the only way a screen changes anything: read-only refusal, the confirmation asking for a reason,
the audit `Operation`, the service call in a worker, the toast and the refresh are all here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.screen import ModalScreen, Screen

from aivedio_engine.services.operations import Operation, current_operator
from tui.commands import ScreensProvider
from tui.mutation import Mutation, explain
from tui.screens.alerts import AlertsScreen
from tui.screens.audit import AuditScreen
from tui.screens.capacity import CapacityScreen
from tui.screens.empty import EmptyDatabaseScreen
from tui.screens.ledger import LedgerScreen
from tui.screens.overview import OverviewScreen
from tui.screens.projects import ProjectsScreen
from tui.screens.replay import ReplayScreen
from tui.screens.review import ReviewScreen
from tui.screens.tasks import TaskDetailScreen, TasksScreen
from tui.screens.unknown import UnknownScreen
from tui.styles import CSS
from tui.widgets import ConfirmModal, HelpScreen

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from tui.data import EngineData
    from tui.graphics import ImageProtocol
    from tui.screens.base import OpsScreen


@dataclass(frozen=True)
class Entry:
    mode: str
    key: str
    title: str
    help: str
    screen: type[Screen[Any]]
    aliases: tuple[str, ...] = ()


ENTRIES = (
    Entry("overview", "1", "Overview", "counts, queue age, outbox, providers, alerts", OverviewScreen, ("ov", "home")),
    Entry("tasks", "2", "Tasks", "all tasks, filter, Enter for the timeline", TasksScreen, ("jobs", "t")),
    Entry("review", "3", "Review queue", "claim, approve, reject held outputs", ReviewScreen, ("rv", "queue")),
    Entry(
        "unknown",
        "4",
        "SUBMIT_UNKNOWN",
        "ambiguous submits, reconcile now",
        UnknownScreen,
        ("su", "reconcile", "ambiguous"),
    ),
    Entry(
        "replay",
        "5",
        "DLQ / orphans",
        "dead letters, orphan events, DEAD outbox rows; replay",
        ReplayScreen,
        ("dlq", "orphans", "outbox", "dead"),
    ),
    Entry("ledger", "6", "Ledger", "tenant balances and entries", LedgerScreen, ("credits", "balance")),
    Entry("capacity", "7", "Capacity", "live capacity model from measured rates", CapacityScreen, ("cap", "slots")),
    Entry(
        "audit",
        "8",
        "Audit",
        "invariant checks (aivedio audit) and their offending rows",
        AuditScreen,
        ("invariants", "checks", "inv"),
    ),
    Entry(
        "alerts",
        "9",
        "Alerts",
        "unresolved engine alerts; acknowledge, resolve",
        AlertsScreen,
        ("al", "alarms", "incidents"),
    ),
    Entry(
        "projects",
        "0",
        "Projects",
        "System B projects; Enter for the step tree, p retry, a approve",
        ProjectsScreen,
        ("pr", "workflows", "steps"),
    ),
)
#: footer labels, short enough that all ten screens fit at 160 columns beside the screen's own keys
SHORT = {
    "overview": "Overview",
    "tasks": "Tasks",
    "review": "Review",
    "unknown": "Unknown",
    "replay": "DLQ",
    "ledger": "Ledger",
    "capacity": "Capacity",
    "audit": "Audit",
    "alerts": "Alerts",
    "projects": "Projects",
}
#: actions that would act behind an open modal (a confirmation, the help, the palette): ignored there
_NOT_IN_MODALS = {"goto", "help", "back", "command_palette"}


class AivedioApp(App[None]):
    TITLE = "aivedio"
    CSS = CSS
    MODES = {e.mode: e.screen for e in ENTRIES}
    DEFAULT_MODE = "overview"
    COMMANDS = App.COMMANDS | {ScreensProvider}
    BINDINGS = [
        Binding("question_mark", "help", "Help"),
        Binding("colon", "command_palette", "Go to…"),
        Binding("escape", "back", "Back", show=False),
        Binding("q", "quit", "Quit", show=False),
        # the digits are shown in the footer (after the screen's own keys): ten screens, one key each
        *(Binding(e.key, f"goto('{e.mode}')", SHORT[e.mode], tooltip=e.title) for e in ENTRIES),
    ]

    def __init__(
        self,
        data: EngineData,
        *,
        readonly: bool = False,
        operator: str | None = None,
        refresh_s: float | None = 2.0,
        image_protocol: ImageProtocol | None = None,
    ) -> None:
        super().__init__()
        self.data = data
        #: how this terminal draws images (tui/graphics.py); None: thumbnails are drawn with half blocks
        self.image_protocol = image_protocol
        self.readonly = readonly
        self.operator = operator or current_operator()
        #: live refresh period of the overview; None: only on demand (r) and when a screen is shown again
        self.refresh_s = refresh_s
        self.entries = ENTRIES
        self.history: list[str] = []
        self.sub_title = f"{data.describe} · {self.operator}" + (" · READ-ONLY" if readonly else "")

    # --- navigation -------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in _NOT_IN_MODALS and isinstance(self.screen, ModalScreen))

    def action_goto(self, mode: str) -> None:
        if mode == self.current_mode:
            return
        self.history = [m for m in self.history if m != self.current_mode][-20:] + [self.current_mode]
        self.switch_mode(mode)

    def action_back(self) -> None:  # type: ignore[override]  # Textual runs sync and async actions alike
        if len(self.screen_stack) > 1:
            self.pop_screen()
        elif self.history:
            self.switch_mode(self.history.pop())

    def open_task(self, task_id: uuid.UUID) -> None:
        self.action_goto("tasks")
        self.push_screen(TaskDetailScreen(task_id))

    def open_tasks(self, filter_text: str) -> None:
        """Drill-down: the Tasks screen filtered as an overview count was counted (`status:QUEUED` …)."""
        self.action_goto("tasks")
        while len(self.screen_stack) > 1:  # a task's timeline left open there: the list is what was asked for
            self.pop_screen()
        screen = self.screen
        if isinstance(screen, TasksScreen) and screen.filter_text != filter_text:
            screen.filter_text = filter_text
            if screen.is_mounted:  # else its first load, when it is shown, reads the new filter
                screen.filter_changed()

    def open_pile(self, kind: str) -> None:
        """Drill-down: the DLQ / orphans screen on one pile (`dlq`, `orphans`, `outbox`)."""
        self.action_goto("replay")
        screen = self.screen
        if isinstance(screen, ReplayScreen):
            screen.show_kind(kind)

    def show_empty_database(self, detail: str) -> None:
        if not isinstance(self.screen, EmptyDatabaseScreen):
            self.push_screen(EmptyDatabaseScreen(self.data.describe, detail))

    def open_alert(self, alert_id: uuid.UUID | None) -> None:
        """The Alerts screen, with the cursor on `alert_id` once it is listed."""
        self.action_goto("alerts")
        screen = self.screen
        if alert_id is not None and isinstance(screen, AlertsScreen):
            screen.highlight(alert_id)

    def action_help(self) -> None:
        screen = self.screen
        own = screen.help_keys() if hasattr(screen, "help_keys") else []
        name = getattr(screen, "NAME", "") or type(screen).__name__
        everywhere = [(e.key, e.title) for e in ENTRIES] + [
            (":", "go to a screen, or a task by its id or the start of it"),
            ("y", "copy the highlighted id"),
            ("Ctrl+P", "command palette"),
            ("Esc", "back"),
            ("?", "this help"),
            ("q", "quit"),
        ]
        self.push_screen(HelpScreen(name, own, everywhere, self.readonly))

    # --- the one mutation path --------------------------------------------------------------------------------

    def refused_readonly(self, command: str) -> bool:
        """True (and the operator told so) in a read-only session; screens that ask for input before building
        their Mutation check this first, so nobody fills in a form for nothing."""
        if self.readonly:
            self.notify(f"read-only session: {command} refused", title="refused", severity="error")
        return self.readonly

    def mutate(self, mutation: Mutation, screen: OpsScreen) -> None:
        if self.refused_readonly(mutation.command):
            return

        def confirmed(reason: str | None) -> None:
            if reason is None:
                self.notify("cancelled: nothing changed", title=mutation.command)
            else:
                self._apply(mutation, reason, screen)

        self.push_screen(
            ConfirmModal(mutation.title, mutation.lines, reason_required=mutation.reason_required), confirmed
        )

    @work(thread=True, group="mutations", exit_on_error=False)
    def _apply(self, mutation: Mutation, reason: str, screen: OpsScreen) -> None:
        op = Operation(command=mutation.command, reason=reason or None, actor=self.operator, args=mutation.args)
        try:
            message = mutation.run(op)
        except Exception as exc:  # noqa: BLE001 - a refusal (Conflict, IllegalState …) is news for the operator
            self.call_from_thread(
                self.notify, explain(exc), title=f"{mutation.command}: not done", severity="error", timeout=10
            )
        else:
            self.call_from_thread(self.notify, message, title=mutation.command)
        self.call_from_thread(self._refresh, screen)

    @staticmethod
    def _refresh(screen: OpsScreen) -> None:
        if screen.is_attached:  # the operator may have left a detail screen while the change ran
            screen.reload()


def run(ctx: AppContext, *, readonly: bool = False, refresh_s: float | None = 2.0) -> None:
    """Run the dashboard on `ctx` until the operator quits (called by `aivedio tui`)."""
    from tui.data import EngineData
    from tui.graphics import detect

    protocol = detect()  # before Textual owns the terminal: the query needs it
    AivedioApp(EngineData(ctx), readonly=readonly, refresh_s=refresh_s, image_protocol=protocol).run()
