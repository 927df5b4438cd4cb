"""DLQ / orphans / DEAD outbox rows / lost observations: what the pipeline gave up on, and replaying it through the
same services as `aivedio replay` (safe to repeat: see services/replay.py and services/keep_moving.py)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from aivedio_engine.services.keep_moving import ObservationReplay
from aivedio_engine.services.replay import KINDS as SERVICE_KINDS
from aivedio_engine.services.replay import Preview
from tui.mutation import Mutation
from tui.screens.base import OpsScreen

SAMPLE = 5
#: the replay service's piles, then the provider observations stored but never applied (`aivedio replay observations`)
KINDS = (*SERVICE_KINDS, "observations")
TITLES = {
    "dlq": "dead letters",
    "orphans": "orphan provider events",
    "outbox": "DEAD outbox rows",
    "observations": "unapplied observations",
}
#: (label, item key) per pile; the first column is always the row id
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "dlq": (
        ("actor", "actor"),
        ("queue", "queue"),
        ("seen", "seen_count"),
        ("last seen", "last_seen_at"),
        ("error", "error"),
    ),
    "orphans": (
        ("provider", "provider"),
        ("job", "job_id"),
        ("source", "source"),
        ("status", "status"),
        ("received", "received_at"),
    ),
    "outbox": (
        ("event", "event_type"),
        ("target", "target"),
        ("attempts", "publish_attempts"),
        ("dead since", "available_at"),
        ("error", "last_error"),
    ),
    "observations": (
        ("task", "task_id"),
        ("provider", "provider"),
        ("job", "job_id"),
        ("status", "status"),
        ("received", "received_at"),
    ),
}


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) >= 19 and text[4:5] == "-" and text[10:11] == "T":  # ISO time from the service's row dicts
        return text[5:19].replace("T", " ")
    return text[:100]


class ReplayScreen(OpsScreen):
    NAME = "DLQ / orphans"
    FILTER_HINT = "filter: words that must appear in a row (actor, error, provider, job …); empty clears"
    MUTATIONS = frozenset({"replay", "replay_all"})
    BINDINGS = [
        Binding("n", "next_kind", "Next pile"),
        Binding("p", "replay", "Replay"),
        Binding("P", "replay_all", "Replay all listed"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.kind = "dlq"
        self.preview: Preview | ObservationReplay | None = None
        self.rows: list[dict[str, Any]] = []

    def compose_body(self) -> ComposeResult:
        yield DataTable(id="replay", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        super().on_mount()
        self._columns()

    def _columns(self) -> None:
        table = self.query_one("#replay", DataTable)
        table.clear(columns=True)
        table.add_column("id", key="id")
        for label, key in COLUMNS[self.kind]:
            table.add_column(label, key=key)
        table.border_title = f"{TITLES[self.kind]} (n: next pile)"

    def action_next_kind(self) -> None:
        self.show_kind(KINDS[(KINDS.index(self.kind) + 1) % len(KINDS)])

    def show_kind(self, kind: str) -> None:
        if kind == self.kind and self.preview is not None:
            return
        self.kind = kind
        self.preview, self.rows = None, []
        if not self.is_mounted:  # opened from the overview: on_mount builds these columns, the first load reads it
            return
        self._columns()
        self.reload()

    def fetch(self) -> tuple[str, Preview | ObservationReplay]:
        kind = self.kind
        return kind, self.ops.data.replay_list(kind)

    def show(self, data: tuple[str, Preview | ObservationReplay]) -> None:
        kind, preview = data
        if kind != self.kind:  # the pile changed while this one was loading
            return
        words = self.filter_text.lower().split()
        self.preview = preview
        self.rows = [i for i in preview.items if all(w in " ".join(map(str, i.values())).lower() for w in words)]
        self.fill(
            self.query_one("#replay", DataTable),
            [(i["id"], (i["id"], *(_cell(i.get(key)) for _, key in COLUMNS[kind]))) for i in self.rows],
        )
        self.set_status(self.status_for(len(self.rows), TITLES[kind], preview.total))

    def action_replay(self) -> None:
        key = self.selected_key(self.query_one("#replay", DataTable))
        self._replay([i for i in self.rows if i["id"] == key])

    def action_replay_all(self) -> None:
        self._replay(list(self.rows))

    def _replay(self, chosen: list[dict[str, Any]]) -> None:
        if not chosen:
            return
        data, kind = self.ops.data, self.kind
        ids = [i["id"] for i in chosen]
        lines = [f"{len(ids)} {TITLES[kind]} will be replayed (exactly these rows):"]
        lines += [f"  {i}" for i in ids[:SAMPLE]]
        if len(ids) > SAMPLE:
            lines.append(f"  … and {len(ids) - SAMPLE} more")
        lines.append("rows that no longer qualify are skipped; repeating a replay changes nothing")
        self.mutate(
            Mutation(
                command=f"tui replay {kind}",
                title=f"Replay {len(ids)} {TITLES[kind]}",
                lines=lines,
                run=lambda op: data.replay(kind, ids, op),
                args={"kind": kind, "ids": ids},
            )
        )
