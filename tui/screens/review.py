"""Review queue: outputs held for a human. Claim an item (a lease, so two reviewers never decide the same
one), look at its output's facts and thumbnail path, approve or reject it with a reason."""

from __future__ import annotations

import uuid
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from aivedio_engine.services.review import ReviewView
from tui.data import AssetFacts, fmt_bytes, short_path
from tui.mutation import Mutation, explain
from tui.screens.base import OpsScreen


class ReviewScreen(OpsScreen):
    NAME = "Review queue"
    FILTER_HINT = "filter: words that must appear in the item's state, reason, reviewer or ids; empty clears"
    MUTATIONS = frozenset({"claim", "approve", "reject"})
    BINDINGS = [
        Binding("c", "claim", "Claim"),
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.items: list[ReviewView] = []
        self.facts: dict[uuid.UUID, AssetFacts] = {}

    def compose_body(self) -> ComposeResult:
        with Vertical(id="review-body"):
            table: DataTable[Any] = DataTable(id="review", cursor_type="row", zebra_stripes=True)
            for label, key in (
                ("item", "id"),
                ("state", "state"),
                ("claimed by", "claimed_by"),
                ("until", "until"),
                ("held because", "reason"),
                ("task", "task_id"),
                ("task status", "task_status"),
            ):
                table.add_column(label, key=key)
            table.border_title = "Open items, oldest first"
            yield table
            card = Static("", id="review-card")
            card.border_title = "Output"
            yield card

    def fetch(self) -> list[ReviewView]:
        words = self.filter_text.lower().split()
        items = self.ops.data.review_items()
        return [i for i in items if all(w in _haystack(i) for w in words)]

    def show(self, items: list[ReviewView]) -> None:
        self.items = items
        self.fill(
            self.query_one("#review", DataTable),
            [
                (
                    str(i.id),
                    (
                        str(i.id),
                        i.state,
                        i.claimed_by or "",
                        i.claimed_until.strftime("%H:%M:%S") if i.claimed_until else "",
                        i.reason[:60],
                        str(i.task_id),
                        i.task_status,
                    ),
                )
                for i in items
            ],
        )
        self.set_status(self.status_for(len(items), "open items"))
        self._show_card()

    def current(self) -> ReviewView | None:
        key = self.selected_key(self.query_one("#review", DataTable))
        return next((i for i in self.items if str(i.id) == key), None)

    # --- the card of the highlighted item ---------------------------------------------------------------------

    @on(DataTable.RowHighlighted, "#review")
    def _show_card(self) -> None:
        item = self.current()
        card = self.query_one("#review-card", Static)
        if item is None:
            card.update(Text("no open review items", style="dim"))
            return
        facts = self.facts.get(item.id)
        card.update(_card(item, facts))
        if facts is None:
            self._load_facts(item)

    @work(thread=True, exclusive=True, group="facts", exit_on_error=False)
    def _load_facts(self, item: ReviewView) -> None:
        worker = get_current_worker()
        try:
            facts = self.ops.data.review_facts(item)
        except Exception as exc:  # noqa: BLE001 - the card says so; the queue stays usable
            if not worker.is_cancelled:
                self.app.call_from_thread(self.notify, explain(exc), title="output facts", severity="error")
            return
        if not worker.is_cancelled:
            self.app.call_from_thread(self._facts_loaded, item.id, facts)

    def _facts_loaded(self, item_id: uuid.UUID, facts: AssetFacts) -> None:
        self.facts[item_id] = facts
        current = self.current()
        if current is not None and current.id == item_id:
            self.query_one("#review-card", Static).update(_card(current, facts))

    # --- actions ----------------------------------------------------------------------------------------------

    def action_claim(self) -> None:
        item = self.current()
        if item is None:
            return
        data = self.ops.data
        self.mutate(
            Mutation(
                command="tui review claim",
                title=f"Claim review item {item.id}",
                lines=[
                    f"task {item.task_id} ({item.task_status}), item {item.state}",
                    f"you ({self.ops.operator}) hold it for 15 minutes; nobody else can decide it meanwhile",
                ],
                run=lambda op: data.claim(item.id, op),
                args={"item": str(item.id), "reviewer": self.ops.operator},
                reason_required=False,
            )
        )

    def action_approve(self) -> None:
        self._decide("approve")

    def action_reject(self) -> None:
        self._decide("reject")

    def _decide(self, verb: str) -> None:
        item = self.current()
        if item is None:
            return
        data = self.ops.data
        outcome = (
            "SUCCEEDED: the client gets the output"
            if verb == "approve"
            else "FAILED_FINAL: the output is withheld (the provider's cost is still settled)"
        )
        run = (lambda op: data.approve(item.id, op)) if verb == "approve" else (lambda op: data.reject(item.id, op))
        self.mutate(
            Mutation(
                command=f"tui review {verb}",
                title=f"{verb.capitalize()} review item {item.id}",
                lines=[
                    f"task {item.task_id} is {item.task_status}; it becomes {outcome}",
                    f"held because: {item.reason}",
                ],
                run=run,
                args={"item": str(item.id), "reviewer": self.ops.operator},
            )
        )


def _haystack(i: ReviewView) -> str:
    return " ".join(str(v).lower() for v in (i.state, i.reason, i.claimed_by, i.id, i.task_id, i.task_status))


def _card(item: ReviewView, facts: AssetFacts | None) -> Text:
    text = Text()
    text.append("task ", style="dim")
    text.append(f"{item.task_id}  ")
    text.append("asset ", style="dim")
    text.append(f"{item.asset_id or '-'}\n")
    if facts is None:
        text.append("loading output facts…", style="dim")
        return text
    duration = f"{facts.duration_ms / 1000:.2f} s" if facts.duration_ms is not None else "-"
    resolution = f"{facts.width}x{facts.height}" if facts.width and facts.height else "-"
    for label, value in (
        ("duration", duration),
        ("size", fmt_bytes(facts.size_bytes)),
        ("resolution", resolution),
        ("type", facts.mime or "-"),
        ("status", facts.status or "-"),
    ):
        text.append(f"{label} ", style="dim")
        text.append(f"{value}   ")
    text.append("\nthumbnail ", style="dim")
    text.append(short_path(facts.thumbnail, 100))
    return text
