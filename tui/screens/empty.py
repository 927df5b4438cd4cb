"""Shown instead of any screen while the database has no engine tables (a fresh PostgreSQL database nobody ran
`aivedio db upgrade` on): says what to do once, rather than a "no such table" toast at every refresh.

`r` checks again by going back to the screen underneath, which reloads; still no tables brings this back.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static


class EmptyDatabaseScreen(ModalScreen[None]):
    BINDINGS = [Binding("r", "check", "Check again"), Binding("q", "app.quit", "Quit")]

    def __init__(self, where: str, detail: str) -> None:
        super().__init__()
        self._where = where
        self._detail = detail

    def compose(self) -> ComposeResult:
        with Vertical(id="empty-box", classes="modal-box"):
            yield Label("This database has no aivedio tables yet", classes="modal-title")
            text = Text()
            text.append("Create them with\n\n")
            text.append("    aivedio db upgrade\n\n", style="bold")
            text.append(
                "(an embedded SQLite database is created by the first `aivedio serve` or `aivedio generate`).\n"
                "Then press r here: the dashboard reads again.\n\n"
            )
            text.append(f"database: {self._where}\n", style="dim")
            text.append(f"it said: {self._detail.splitlines()[0][:160]}", style="dim")  # the SQL is noise here
            yield Static(text, id="empty-text")
            yield Label("[b]r[/] check again   [b]q[/] quit", classes="modal-hint")

    def action_check(self) -> None:
        self.dismiss(None)
