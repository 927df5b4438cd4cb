"""Review queue: outputs held for a human. Claim an item (a lease, so two reviewers never decide the same
one), read the prompt, the output's probe facts and its thumbnail (drawn in the terminal), watch it (`o`: the
system player, or a signed playback URL), approve or reject it with a reason."""

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
from tui.graphics import ImageProtocol, image_widget
from tui.mutation import Mutation, explain
from tui.opener import can_open_locally, open_locally
from tui.preview import half_blocks
from tui.screens.base import OpsScreen


class ReviewScreen(OpsScreen):
    NAME = "Review queue"
    FILTER_HINT = "filter: words that must appear in the item's state, reason, reviewer or ids; empty clears"
    MUTATIONS = frozenset({"claim", "approve", "reject"})
    BINDINGS = [
        Binding("c", "claim", "Claim"),
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
        Binding("o", "open_media", "Play", tooltip="open the proxy MP4, or copy a signed playback URL"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.items: list[ReviewView] = []
        self.facts: dict[uuid.UUID, AssetFacts] = {}
        #: the last signed playback URL `o` made (shown under the card until another item is highlighted)
        self.player_url: str | None = None
        #: the image file shown under the card (terminals that draw images), None: none shown
        self.thumb_path: str | None = None

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
            yield Vertical(id="review-thumb")  # the thumbnail as an image, where the terminal draws images

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
                        str(i.task_id or i.subject),
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
        url = self.player_url if self.player_url and str(item.task_id) in self.player_url else None
        protocol = getattr(self.app, "image_protocol", None)
        image = facts.thumbnail_file if facts is not None and protocol is not None else None
        card.update(_card(item, facts, url, blocks=image is None))
        self._show_thumbnail(protocol, image)
        if facts is None:
            self._load_facts(item)

    def _show_thumbnail(self, protocol: ImageProtocol | None, path: str | None) -> None:
        """The image under the card (sixel/TGP terminals), or nothing: the card then holds the block preview."""
        box = self.query_one("#review-thumb", Vertical)
        if self.thumb_path == path:
            return
        self.thumb_path = path
        box.remove_children()
        box.display = path is not None
        if protocol is not None and path is not None:
            box.mount(image_widget(protocol, path))

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
            self._show_card()

    # --- watching the output --------------------------------------------------------------------------------

    def action_open_media(self) -> None:
        item = self.current()
        if item is None or item.task_id is None:
            self.notify("no generation output to open here", title="open")
            return
        facts = self.facts.get(item.id)
        if facts is not None and facts.proxy and can_open_locally():
            try:
                open_locally(facts.proxy)
            except OSError as exc:
                self.notify(str(exc), title="open", severity="error")
            else:
                self.notify(facts.proxy, title="opened in the system player")
            return
        self._player_link(item.task_id)

    @work(thread=True, exclusive=True, group="link", exit_on_error=False)
    def _player_link(self, task_id: uuid.UUID) -> None:
        try:
            link = self.ops.data.player_link(task_id)
        except Exception as exc:  # noqa: BLE001 - e.g. no proxy MP4 yet: said, the screen stays usable
            self.app.call_from_thread(self.notify, explain(exc), title="playback URL", severity="error")
            return
        self.app.call_from_thread(self._show_link, link)

    def _show_link(self, link: str) -> None:
        self.player_url = link
        self.app.copy_to_clipboard(link)
        self.notify(link, title="signed playback URL (copied; served by `aivedio serve`)", timeout=30)
        self._show_card()

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
                    f"{item.subject} ({item.task_status}), item {item.state}",
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
        if item.workflow_task_id is not None:  # a System B step: it moves, no credits do
            outcome = "success: the project goes on" if verb == "approve" else "failed: the project stops there"
        else:
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
                    f"{item.subject} is {item.task_status}; it becomes {outcome}",
                    f"held because: {item.reason}",
                ],
                run=run,
                args={"item": str(item.id), "reviewer": self.ops.operator},
            )
        )


def _haystack(i: ReviewView) -> str:
    return " ".join(str(v).lower() for v in (i.state, i.reason, i.claimed_by, i.id, i.task_id, i.task_status))


def _card(item: ReviewView, facts: AssetFacts | None, url: str | None = None, *, blocks: bool = True) -> Text:
    """The card's text; `blocks`: with the half-block thumbnail (else the image widget below shows it)."""
    text = Text()
    text.append("task ", style="dim")
    text.append(f"{item.task_id or item.subject}  ")
    text.append("asset ", style="dim")
    text.append(f"{item.asset_id or '-'}\n")
    if facts is None:
        text.append("loading output facts…", style="dim")
        return text
    text.append("prompt ", style="dim")
    text.append(f"{facts.prompt or '-'}\n", style="bold")
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
    text.append(short_path(facts.thumbnail, 200))
    if url:
        text.append("\nplayback ", style="dim")
        text.append(url)
    if not blocks:
        return text
    text.append("\n")
    if facts.preview is not None:
        text.append_text(half_blocks(facts.preview))
    else:
        text.append("(no thumbnail preview: none stored on this machine)", style="dim")
    return text
