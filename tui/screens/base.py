"""What every operator screen shares: header/footer chrome, loading in a thread worker, the `/` filter and the
keys `?` help lists.

A screen implements `fetch()` (runs in a worker thread: it may block on the database) and `show(data)` (runs on
the event loop: it only renders). Loads are exclusive per screen, so a slow read is superseded by the next one
instead of queueing behind it, and a superseded result is dropped rather than painted over newer data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label
from textual.worker import get_current_worker

from tui.mutation import Mutation, explain, schema_missing
from tui.widgets import FilterPrompt, key_label

if TYPE_CHECKING:
    from tui.app import AivedioApp


class OpsScreen(Screen[None]):
    #: the name in the header, the help screen and the command palette
    NAME: ClassVar[str] = ""
    #: the `/` prompt's hint; None: this screen has no filter
    FILTER_HINT: ClassVar[str | None] = None
    #: actions that change data: hidden from the footer and refused in a read-only session
    MUTATIONS: ClassVar[frozenset[str]] = frozenset()
    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("r", "reload", "Refresh"),
        Binding("y", "copy_id", "Copy id"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.filter_text = ""
        self.loads = 0  # completed loads; tests and the status line read it

    @property
    def ops(self) -> AivedioApp:
        return self.app  # type: ignore[return-value]

    # --- chrome -----------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield from self.compose_body()
        yield Label("loading…", id="status-line")
        yield Footer(compact=True)  # ten screen keys and the screen's own fit in 160 columns

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError

    def on_mount(self) -> None:
        self.title = f"aivedio · {self.NAME}"
        self.sub_title = self.ops.sub_title

    def on_screen_resume(self) -> None:
        self.resumed()

    def resumed(self) -> None:
        """Shown (again): coming back to a screen (another screen, a modal, the palette) shows fresh data.
        A subclass overrides this, not `on_screen_resume` (Textual calls that handler of every class in the MRO)."""
        self.reload()

    def set_status(self, text: str) -> None:
        self.query_one("#status-line", Label).update(text)

    # --- keys -------------------------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.MUTATIONS and self.ops.readonly:
            return False  # hidden, and the key does nothing (AivedioApp.mutate refuses too)
        if action == "filter" and self.FILTER_HINT is None:
            return False
        return True

    def help_keys(self) -> list[tuple[str, str]]:
        """This screen's keys for `?`, without the ones a read-only session cannot use."""
        keys: dict[str, str] = {}  # a screen's own binding of a key replaces the base's description
        # only the bindings of operator screens: Textual's own (tab, ctrl+c) are not what `?` is asked about
        for cls in [c for c in reversed(type(self).__mro__) if isinstance(c, type) and issubclass(c, OpsScreen)]:
            for b in cls.__dict__.get("BINDINGS", []):
                if isinstance(b, Binding) and b.description and self.check_action(b.action, ()) is not False:
                    keys[key_label(b.key)] = b.description
        return list(keys.items())

    def action_filter(self) -> None:
        if self.FILTER_HINT is None:
            return

        def apply(text: str | None) -> None:
            if text is not None and text != self.filter_text:
                self.filter_text = text
                self.filter_changed()

        self.app.push_screen(FilterPrompt(self.filter_text, self.FILTER_HINT), apply)

    def filter_changed(self) -> None:
        """The `/` filter changed: load again (a screen that filters what it already has may just re-render)."""
        self.reload()

    def action_reload(self) -> None:
        self.reload()

    def action_copy_id(self) -> None:
        """`y`: the highlighted row's id, whole, to the clipboard (OSC 52 reaches the operator's own terminal
        through ssh and tmux) and in a toast — the tables may cut a long cell, the copy never does."""
        text = self.copy_text()
        if not text:
            self.notify("nothing highlighted to copy", title="copy")
            return
        self.app.copy_to_clipboard(text)
        self.notify(text, title="copied")

    def copy_text(self) -> str | None:
        """What `y` copies: the row key of the focused table (else the first table), which every screen makes
        the row's id. A screen without a table overrides this."""
        focused = self.focused
        tables = [focused] if isinstance(focused, DataTable) else list(self.query(DataTable))
        for table in tables:
            if table.cursor_type != "none" and (key := self.selected_key(table)) is not None:
                return key
        return None

    def mutate(self, mutation: Mutation) -> None:
        self.ops.mutate(mutation, self)

    # --- loading ----------------------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def reload(self) -> None:
        worker = get_current_worker()
        try:
            data = self.fetch()
        except Exception as exc:  # noqa: BLE001 - shown to the operator; the screen stays usable
            if not worker.is_cancelled:
                if schema_missing(exc):  # one friendly screen instead of a toast per refresh
                    self.app.call_from_thread(self.ops.show_empty_database, explain(exc))
                else:
                    self.app.call_from_thread(self._failed, explain(exc))
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._loaded, data)

    def _loaded(self, data: Any) -> None:
        self.show(data)
        self.loads += 1

    def _failed(self, message: str) -> None:
        self.set_status(f"[b red]load failed:[/] {escape(message)}")
        self.notify(message, title=f"{self.NAME}: load failed", severity="error")
        self.loads += 1

    def fetch(self) -> Any:
        raise NotImplementedError

    def show(self, data: Any) -> None:
        raise NotImplementedError

    # --- helpers for table screens ----------------------------------------------------------------------------

    def selected_key(self, table: DataTable[Any]) -> str | None:
        """The row key under the cursor (None on an empty table)."""
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return None if key is None else str(key)

    def fill(self, table: DataTable[Any], rows: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Replace the rows, keeping the cursor on the same row key when it is still there."""
        keep = self.selected_key(table)
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        keys = [k for k, _ in rows]
        if keep in keys:
            table.move_cursor(row=keys.index(keep))

    def status_for(self, shown: int, noun: str, total: int | None = None) -> str:
        text = f"{shown} {noun}" + (f" of {total}" if total is not None and total != shown else "")
        if self.filter_text:
            text += f" · filter: {escape(self.filter_text)}"
        if self.ops.readonly:
            text += " · read-only"
        return text
