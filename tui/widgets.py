"""Modals shared by every screen: the confirmation that asks for a reason, the `/` filter prompt, `?` help, the
ledger adjustment form and the job id of an ambiguous submit."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from aivedio_engine.services.ledger_ops import MAX_KEY


class ConfirmModal(ModalScreen[str | None]):
    """Says exactly what will change and asks why. Dismisses with the reason (possibly "" when a reason is
    optional), or None when cancelled. Nothing is changed by the modal itself."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        title: str,
        lines: Sequence[str],
        *,
        reason_required: bool = True,
        confirm_label: str = "Confirm",
        danger: bool = True,
    ) -> None:
        super().__init__()
        self._title = title
        self._lines = list(lines)
        self._required = reason_required
        self._confirm_label = confirm_label
        self._danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="modal-box"):
            yield Label(self._title, id="confirm-title", classes="modal-title")
            yield Static(Text("\n".join(self._lines)), id="confirm-lines")
            hint = (
                "Reason (required; stored in the audit log)"
                if self._required
                else "Reason (optional; stored in the audit log)"
            )
            yield Label(hint, classes="modal-hint")
            yield Input(placeholder="why? e.g. INC-1234 …", id="reason")
            yield Label("", id="confirm-error", classes="modal-error")
            with Horizontal(classes="modal-buttons"):
                yield Button(self._confirm_label, id="confirm", variant="error" if self._danger else "primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#reason", Input).focus()

    @on(Input.Submitted, "#reason")
    @on(Button.Pressed, "#confirm")
    def _confirm(self) -> None:
        reason = self.query_one("#reason", Input).value.strip()
        if self._required and not reason:
            self.query_one("#confirm-error", Label).update("a reason is required")
            return
        self.dismiss(reason)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class FilterPrompt(ModalScreen[str | None]):
    """The k9s `/` prompt: one line at the bottom; Enter applies (empty clears), Esc keeps the old filter."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str, hint: str) -> None:
        super().__init__()
        self._current = current
        self._hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="filter-box"):
            yield Label(self._hint, classes="modal-hint")
            yield Input(value=self._current, placeholder="/ filter …", id="filter")

    def on_mount(self) -> None:
        self.query_one("#filter", Input).focus()

    @on(Input.Submitted, "#filter")
    def _apply(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """`?`: the keys of the screen it was opened from, then the keys that work everywhere."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(
        self,
        screen_title: str,
        screen_keys: Iterable[tuple[str, str]],
        global_keys: Iterable[tuple[str, str]],
        readonly: bool,
    ) -> None:
        super().__init__()
        self._screen_title = screen_title
        self._screen_keys = list(screen_keys)
        self._global_keys = list(global_keys)
        self._readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box", classes="modal-box"):
            yield Label(f"Help — {self._screen_title}", classes="modal-title")
            with Horizontal(id="help-columns"):
                yield Static(_key_table(self._screen_title, self._screen_keys), id="help-screen-keys")
                yield Static(_key_table("Everywhere", self._global_keys), id="help-global-keys")
            if self._readonly:
                yield Label("read-only session: every action that changes data is refused", classes="modal-error")
            yield Label("Esc, ? or q closes this help", classes="modal-hint")

    def action_close(self) -> None:
        self.dismiss(None)


def _key_table(title: str, keys: Sequence[tuple[str, str]]) -> Text:
    text = Text()
    text.append(f"{title}\n", style="bold underline")
    if not keys:
        text.append("  (no keys of its own)\n", style="dim")
    for key, what in keys:
        text.append(f"  {key:<12}", style="bold")
        text.append(f"{what}\n")
    return text


def key_label(key: str) -> str:
    """Binding key names → what is printed on the keycap."""
    names = {"question_mark": "?", "slash": "/", "colon": ":", "escape": "Esc", "enter": "Enter", "space": "Space"}
    return ",".join(names.get(k, k) for k in key.split(","))


@dataclass(frozen=True)
class AdjustRequest:
    """What the adjustment form collected (checked for shape; the ledger service decides the rest)."""

    amount: Decimal
    business_key: str
    task_id: uuid.UUID | None


#: the ledger's numeric(20,8): more decimals than this cannot be booked
_QUANTUM = Decimal("0.00000001")


def parse_adjustment(amount: str, business_key: str, task: str) -> AdjustRequest:
    """The form's fields → an AdjustRequest; ValueError with a message for the operator when one is wrong."""
    try:
        value = Decimal(amount.strip().replace(" ", "").lstrip("+"))
    except InvalidOperation:
        raise ValueError(f"amount must be a signed number such as -5 or 12.5, not {amount.strip()!r}") from None
    if not value.is_finite() or value == 0 or abs(value) >= Decimal("1e12"):
        raise ValueError("amount must be a non-zero number below 1e12 in magnitude")
    if value != value.quantize(_QUANTUM):
        raise ValueError("amount has more than 8 decimal places")
    key = business_key.strip()
    if not key:
        raise ValueError("a business key is required: it makes booking the same correction twice a no-op")
    if len(key) > MAX_KEY or not key.isprintable():
        raise ValueError(f"business key must be 1..{MAX_KEY} printable characters")
    task_id = None
    if task.strip():
        try:
            task_id = uuid.UUID(task.strip())
        except ValueError:
            raise ValueError(f"task must be a task id (a UUID), not {task.strip()!r}") from None
    return AdjustRequest(value, key, task_id)


class AdjustForm(ModalScreen[AdjustRequest | None]):
    """`a` on the ledger screen: amount, business key and an optional task for one ADJUSTMENT. Dismisses with
    the request (the confirmation asking the reason comes next, from `AivedioApp.mutate`) or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, tenant: str, balance: str) -> None:
        super().__init__()
        self._tenant = tenant
        self._balance = balance

    def compose(self) -> ComposeResult:
        with Vertical(id="adjust-box", classes="modal-box"):
            yield Label(f"Adjust the credits of {self._tenant}", classes="modal-title")
            yield Static(
                Text(f"current balance {self._balance}; an ADJUSTMENT is appended to the ledger, nothing is rewritten"),
                id="adjust-balance",
            )
            yield Label("Amount (signed: -5 takes 5 credits, 12.5 adds 12.5)", classes="modal-hint")
            yield Input(placeholder="e.g. -5 or 12.5", id="amount")
            yield Label("Business key (required; the same key again is a no-op), e.g. INC-1234", classes="modal-hint")
            yield Input(placeholder="e.g. INC-1234-refund", id="business-key")
            yield Label("Task id (optional: the task this correction is about)", classes="modal-hint")
            yield Input(placeholder="task UUID or empty", id="task")
            yield Label("", id="adjust-error", classes="modal-error")
            with Horizontal(classes="modal-buttons"):
                yield Button("Next: confirm", id="adjust-submit", variant="primary")
                yield Button("Cancel", id="adjust-cancel")

    def on_mount(self) -> None:
        self.query_one("#amount", Input).focus()

    @on(Input.Submitted)
    @on(Button.Pressed, "#adjust-submit")
    def _submit(self) -> None:
        try:
            request = parse_adjustment(
                *(self.query_one(f"#{i}", Input).value for i in ("amount", "business-key", "task"))
            )
        except ValueError as exc:
            self.query_one("#adjust-error", Label).update(str(exc))
            return
        self.dismiss(request)

    @on(Button.Pressed, "#adjust-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class JobIdPrompt(ModalScreen[str | None]):
    """`b` on the SUBMIT_UNKNOWN screen: the job id found in the vendor's console. Dismisses with it (the
    confirmation asking the reason comes next) or None; the provider is asked for the job only once confirmed."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, task: str, provider: str) -> None:
        super().__init__()
        self._task_id = task
        self._provider = provider

    def compose(self) -> ComposeResult:
        with Vertical(id="job-box", classes="modal-box"):
            yield Label(f"Bind a job to task {self._task_id}", classes="modal-title")
            yield Label(
                f"The job id in {self._provider}'s console (search it by the attempt's request key)",
                classes="modal-hint",
            )
            yield Input(placeholder="job id", id="job-id")
            yield Label("", id="job-error", classes="modal-error")

    def on_mount(self) -> None:
        self.query_one("#job-id", Input).focus()

    @on(Input.Submitted, "#job-id")
    def _submit(self) -> None:
        job_id = self.query_one("#job-id", Input).value.strip()
        if not job_id:
            self.query_one("#job-error", Label).update("a job id is required")
            return
        self.dismiss(job_id)

    def action_cancel(self) -> None:
        self.dismiss(None)
