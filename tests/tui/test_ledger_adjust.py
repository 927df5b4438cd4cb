"""`a` on the ledger screen against a tenant whose balance real generations moved: the form checks its fields
inline, a booked ADJUSTMENT goes through `LedgerOps.adjust` with an audit row, the same business key again is a
no-op, the ledger service's refusals are shown, and a read-only session never opens the form."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from textual.pilot import Pilot
from textual.widgets import DataTable, Label

from tests.support.seeding import Seeded
from tests.tui.conftest import OPERATOR, drive, make_app, press, rows, type_text
from tui.screens.ledger import LedgerScreen
from tui.widgets import AdjustForm, ConfirmModal


def _error(form: AdjustForm) -> str:
    return str(form.query_one("#adjust-error", Label).render())


async def _fill(pilot: Pilot[Any], amount: str, key: str, task: str = "") -> None:
    """Open the form on the highlighted tenant and fill its three fields (Tab moves to the next one)."""
    await press(pilot, "e")
    assert isinstance(pilot.app.screen, AdjustForm)
    for i, value in enumerate((amount, key, task)):
        if i:
            await press(pilot, "tab")
        if value:
            await type_text(pilot, value)


async def _confirm(pilot: Pilot[Any], reason: str) -> None:
    await press(pilot, "enter")  # the form → the confirmation asking why
    assert isinstance(pilot.app.screen, ConfirmModal)
    await type_text(pilot, reason)
    await press(pilot, "enter")


def test_adjust_validates_books_once_then_reports_the_duplicate_and_refusals(world: Seeded) -> None:
    start = world.balance()
    boat = world.tasks["boat"]
    app, toasts = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "6")
        ledger = app.screen
        assert isinstance(ledger, LedgerScreen)
        assert ("e", "Adjust credits") in ledger.help_keys()

        # bad input: the form stays open and says what is wrong, field by field
        await press(pilot, "e")
        form = app.screen
        assert isinstance(form, AdjustForm)
        await type_text(pilot, "five")
        await press(pilot, "enter")
        assert app.screen is form and "amount must be a signed number" in _error(form)
        await press(pilot, "ctrl+u")
        await type_text(pilot, "0.000000001")
        await press(pilot, "enter")
        assert "more than 8 decimal places" in _error(form)
        await press(pilot, "ctrl+u")
        await type_text(pilot, "-5")
        await press(pilot, "enter")
        assert "business key is required" in _error(form)
        await press(pilot, "tab")
        await type_text(pilot, "INC-42")
        await press(pilot, "tab")
        await type_text(pilot, "not-a-task")
        await press(pilot, "enter")
        assert app.screen is form and "task must be a task id" in _error(form)
        await press(pilot, "ctrl+u")
        await type_text(pilot, str(boat))

        # the confirmation states tenant, balance, amount, key and task before asking why
        await press(pilot, "enter")
        modal = app.screen
        assert isinstance(modal, ConfirmModal)
        lines = str(modal.query_one("#confirm-lines").render())
        assert f"tenant acme ({world.tenant_id})" in lines
        assert f"current balance {start.normalize():f}; booked, it becomes {(start - 5).normalize():f}" in lines
        assert "amount -5 credits" in lines and "business key 'INC-42'" in lines and f"task {boat}" in lines
        await type_text(pilot, "INC-42 goodwill for a re-render")
        await press(pilot, "enter")
        assert app.screen is ledger
        assert world.balance() == start - 5
        (booked,) = world.audit_rows("tui ledger adjust")
        assert (booked.actor, booked.reason, booked.outcome, booked.dry_run) == (
            OPERATOR,
            "INC-42 goodwill for a re-render",
            "booked",
            False,
        )
        assert booked.args == {
            "tenant": str(world.tenant_id),
            "amount": "-5",
            "business_key": "INC-42",
            "task": str(boat),
        }
        assert f"booked -5 credits for acme under 'INC-42': balance {start.normalize():f}" in toasts.text()
        (acme,) = rows(ledger.query_one("#balances", DataTable)).values()
        assert Decimal(acme[2]) == start - 5 and acme[6] == "yes"  # refreshed; still equals the ledger sum
        entries = rows(ledger.query_one("#entries", DataTable))
        (adjustment,) = [cells for cells in entries.values() if cells[5] == "adjustment:manual:INC-42"]
        assert adjustment[1:] == [
            "ADJUSTMENT",
            "-5",
            "INC-42 goodwill for a re-render",
            OPERATOR,
            "adjustment:manual:INC-42",
            str(boat),
        ]

        # the same business key again: a no-op, said so
        await _fill(pilot, "-5", "INC-42", str(boat))
        await _confirm(pilot, "did it go through?")
        assert world.balance() == start - 5
        assert "duplicate: business key 'INC-42' is already booked for acme; nothing changed" in toasts.text()
        assert [r.outcome for r in world.audit_rows("tui ledger adjust")] == ["booked", "duplicate"]

        # refusals by the ledger service: a reused key with another amount; a balance below zero
        await _fill(pilot, "-7", "INC-42", str(boat))
        await _confirm(pilot, "typo")
        assert any(s == "error" and m.startswith("refused: business key 'INC-42' was already used") for s, m in toasts)
        await _fill(pilot, "-100000", "INC-43")
        await _confirm(pilot, "clawback")
        assert any(s == "error" and m.startswith("refused: tenant acme has") for s, m in toasts)
        assert world.balance() == start - 5
        # a refusal is audited (Conflict and InsufficientCredits are part of the story; see LedgerOps.adjust)
        assert [r.outcome for r in world.audit_rows("tui ledger adjust")] == [
            "booked",
            "duplicate",
            "refused",
            "refused",
        ]

        # Esc on the form changes nothing
        await press(pilot, "e", "escape")
        assert app.screen is ledger and "cancelled: nothing changed" in toasts.text()

    drive(app, scenario)


def test_readonly_never_opens_the_form(world: Seeded) -> None:
    start = world.balance()
    app, toasts = make_app(world.ctx, readonly=True)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "6")
        ledger = app.screen
        assert isinstance(ledger, LedgerScreen)
        await press(pilot, "e")  # disabled: nothing opens
        assert app.screen is ledger
        assert "Adjust credits" not in "".join(d for _, d in ledger.help_keys())

        ledger.action_adjust()  # reached another way, it is refused before anyone fills in a form
        await press(pilot)
        assert app.screen is ledger
        assert ("error", "read-only session: tui ledger adjust refused") in toasts

    drive(app, scenario)
    assert world.balance() == start and world.audit_rows("tui ledger adjust") == []
