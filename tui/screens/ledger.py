"""Ledger: every tenant's balance against its ledger sum, and the entries of the highlighted tenant; `a` books
one ADJUSTMENT for the highlighted tenant through `LedgerOps.adjust` (the service of `aivedio ledger adjust`)."""

from __future__ import annotations

import uuid
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable
from textual.worker import get_current_worker

from aivedio_engine.services.ledger_ops import Balance
from tui.data import fmt_money
from tui.mutation import Mutation, explain
from tui.screens.base import OpsScreen
from tui.widgets import AdjustForm, AdjustRequest

COMMAND = "tui ledger adjust"


class LedgerScreen(OpsScreen):
    NAME = "Ledger"
    FILTER_HINT = "filter: words that must appear in the tenant's name or id; empty clears"
    MUTATIONS = frozenset({"adjust"})
    BINDINGS = [Binding("e", "adjust", "Adjust credits")]

    def __init__(self) -> None:
        super().__init__()
        self.balances: list[Balance] = []
        self.entries_of: uuid.UUID | None = None

    def compose_body(self) -> ComposeResult:
        with Vertical(id="ledger-body"):
            balances: DataTable[Any] = DataTable(id="balances", cursor_type="row", zebra_stripes=True)
            for label, key in (
                ("tenant", "tenant"),
                ("id", "id"),
                ("balance", "balance"),
                ("ledger sum", "sum"),
                ("held by open tasks", "reserved"),
                ("entries", "entries"),
                ("consistent", "ok"),
            ):
                balances.add_column(label, key=key)
            balances.border_title = "Balances"
            yield balances
            entries: DataTable[Any] = DataTable(id="entries", cursor_type="row", zebra_stripes=True)
            for label, key in (
                ("at", "at"),
                ("type", "type"),
                ("amount", "amount"),
                # the reason is what an operator reads: before the long keys and ids, never cut off screen
                ("reason", "reason"),
                ("by", "by"),
                ("business key", "key"),
                ("task", "task"),
            ):
                entries.add_column(label, key=key)
            entries.border_title = "Entries (newest first)"
            yield entries

    def fetch(self) -> list[Balance]:
        words = self.filter_text.lower().split()
        return [b for b in self.ops.data.balances() if all(w in f"{b.tenant} {b.tenant_id}".lower() for w in words)]

    def show(self, balances: list[Balance]) -> None:
        self.balances = balances
        self.fill(
            self.query_one("#balances", DataTable),
            [
                (
                    str(b.tenant_id),
                    (
                        b.tenant,
                        str(b.tenant_id),
                        fmt_money(b.credit_balance),
                        fmt_money(b.ledger_sum),
                        fmt_money(b.reserved),
                        str(b.entries),
                        "yes" if b.consistent else "NO",
                    ),
                )
                for b in balances
            ],
        )
        self.set_status(self.status_for(len(balances), "tenants"))
        self._tenant_highlighted()

    @on(DataTable.RowHighlighted, "#balances")
    def _tenant_highlighted(self) -> None:
        key = self.selected_key(self.query_one("#balances", DataTable))
        if key is None:
            self.query_one("#entries", DataTable).clear()
            return
        self._load_entries(uuid.UUID(key))

    @work(thread=True, exclusive=True, group="entries", exit_on_error=False)
    def _load_entries(self, tenant_id: uuid.UUID) -> None:
        worker = get_current_worker()
        try:
            rows = self.ops.data.entries(tenant_id)
        except Exception as exc:  # noqa: BLE001
            if not worker.is_cancelled:
                self.app.call_from_thread(self.notify, explain(exc), title="ledger entries", severity="error")
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._show_entries, tenant_id, rows)

    def _show_entries(self, tenant_id: uuid.UUID, rows: list[dict[str, Any]]) -> None:
        self.entries_of = tenant_id
        self.fill(
            self.query_one("#entries", DataTable),
            [
                (
                    str(r["id"]),
                    (
                        r["created_at"].strftime("%m-%d %H:%M:%S"),
                        r["entry_type"],
                        fmt_money(r["amount"]),
                        r["reason"] or "",
                        r["created_by"] or "",
                        r["business_key"],
                        str(r["task_id"] or ""),
                    ),
                )
                for r in rows
            ],
        )

    # --- adjust -----------------------------------------------------------------------------------------------

    def current(self) -> Balance | None:
        key = self.selected_key(self.query_one("#balances", DataTable))
        return next((b for b in self.balances if str(b.tenant_id) == key), None)

    def action_adjust(self) -> None:
        tenant = self.current()
        if tenant is None or self.ops.refused_readonly(COMMAND):
            return

        def submitted(request: AdjustRequest | None) -> None:
            if request is None:
                self.notify("cancelled: nothing changed", title=COMMAND)
            else:
                self._confirm(tenant, request)

        self.app.push_screen(AdjustForm(tenant.tenant, fmt_money(tenant.credit_balance)), submitted)

    def _confirm(self, b: Balance, r: AdjustRequest) -> None:
        data = self.ops.data
        after = b.credit_balance + r.amount
        signed = f"{'+' if r.amount > 0 else ''}{fmt_money(r.amount)}"
        lines = [
            f"tenant {b.tenant} ({b.tenant_id})",
            f"current balance {fmt_money(b.credit_balance)}; booked, it becomes {fmt_money(after)}",
            f"amount {signed} credits (an ADJUSTMENT ledger entry)",
            f"business key {r.business_key!r}: booking it again changes nothing",
            f"task {r.task_id or '(none)'}",
        ]
        if after < 0:
            lines.append("the balance cannot go negative: the ledger service will refuse this")
        self.mutate(
            Mutation(
                command=COMMAND,
                title=f"Adjust {b.tenant} by {signed} credits",
                lines=lines,
                run=lambda op: data.adjust(b.tenant_id, r.amount, r.business_key, r.task_id, op),
                args={
                    "tenant": str(b.tenant_id),
                    "amount": str(r.amount),
                    "business_key": r.business_key,
                    "task": str(r.task_id) if r.task_id else None,
                },
            )
        )
