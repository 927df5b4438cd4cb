"""SUBMIT_UNKNOWN: tasks whose submit got no answer we can trust. "Reconcile now" runs the sweeper's own lookup
(`ReconcileOps.run`: found → job bound, not created → new attempt, else the next lookup or a park) at once.
When the lookups cannot decide, an operator settles one task on their own word, as `aivedio reconcile --task T
--job-id J` / `--not-created` do: bind the job found in the vendor's console, or declare it never created."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable

from aivedio_engine.services.reconcile_ops import Candidate
from tui.mutation import Mutation
from tui.screens.base import OpsScreen
from tui.widgets import JobIdPrompt

#: ids listed in a confirmation before "… and N more" (the count is always exact)
SAMPLE = 5


class UnknownScreen(OpsScreen):
    NAME = "SUBMIT_UNKNOWN"
    FILTER_HINT = "filter: words that must appear in the provider, task status or ids; empty clears"
    MUTATIONS = frozenset({"reconcile", "reconcile_all", "bind_job", "not_created"})
    BINDINGS = [
        Binding("p", "reconcile", "Reconcile now"),
        Binding("P", "reconcile_all", "Reconcile all listed"),
        Binding("b", "bind_job", "Bind a job id"),
        Binding("d", "not_created", "Never created"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.candidates: list[Candidate] = []

    def compose_body(self) -> ComposeResult:
        table: DataTable[Any] = DataTable(id="unknown", cursor_type="row", zebra_stripes=True)
        for label, key in (
            ("task", "task_id"),
            ("provider", "provider"),
            ("task status", "status"),
            ("sent", "sent"),
            ("lookups", "lookups"),
            ("last lookup", "last"),
            ("next action", "next"),
            ("parked", "parked"),
        ):
            table.add_column(label, key=key)
        table.border_title = "Ambiguous submits, oldest send first"
        yield table

    def fetch(self) -> list[Candidate]:
        words = self.filter_text.lower().split()
        found = self.ops.data.unknown()
        return [
            c
            for c in found
            if all(w in f"{c.provider} {c.task_status} {c.task_id} {c.attempt_id}".lower() for w in words)
        ]

    def show(self, found: list[Candidate]) -> None:
        self.candidates = found
        self.fill(
            self.query_one("#unknown", DataTable),
            [
                (
                    str(c.task_id),
                    (
                        str(c.task_id),
                        c.provider,
                        c.task_status,
                        f"{c.sent_at:%m-%d %H:%M:%S}",
                        str(c.lookup_count),
                        f"{c.last_lookup_at:%H:%M:%S}" if c.last_lookup_at else "-",
                        f"{c.next_action_at:%H:%M:%S}" if c.next_action_at else "-",
                        "parked" if c.parked else "",
                    ),
                )
                for c in found
            ],
        )
        self.set_status(self.status_for(len(found), "ambiguous submits"))

    def action_reconcile(self) -> None:
        key = self.selected_key(self.query_one("#unknown", DataTable))
        self._reconcile([c for c in self.candidates if str(c.task_id) == key])

    def action_reconcile_all(self) -> None:
        self._reconcile(list(self.candidates))

    def _reconcile(self, chosen: list[Candidate]) -> None:
        if not chosen:
            return
        data = self.ops.data
        ids = [c.task_id for c in chosen]
        lines = [f"{len(ids)} task(s) will be looked up at their provider now:"]
        lines += [f"  {c.task_id}  {c.provider}  sent {c.sent_at:%m-%d %H:%M:%S}" for c in chosen[:SAMPLE]]
        if len(chosen) > SAMPLE:
            lines.append(f"  … and {len(chosen) - SAMPLE} more")
        lines.append("a 'not found' is only believed 60 s after the send")
        self.mutate(
            Mutation(
                command="tui reconcile",
                title=f"Reconcile {len(ids)} ambiguous submit(s)",
                lines=lines,
                run=lambda op: data.reconcile(ids, op),
                args={"tasks": [str(i) for i in ids]},
            )
        )

    # --- one task on the operator's word ---------------------------------------------------------------------

    def current(self) -> Candidate | None:
        key = self.selected_key(self.query_one("#unknown", DataTable))
        return next((c for c in self.candidates if str(c.task_id) == key), None)

    def action_bind_job(self) -> None:
        chosen = self.current()
        if chosen is None or self.ops.refused_readonly("tui reconcile bind"):
            return

        def entered(job_id: str | None) -> None:
            if job_id is None:
                self.notify("cancelled: nothing changed", title="tui reconcile bind")
            else:
                self._bind(chosen, job_id)

        self.app.push_screen(JobIdPrompt(str(chosen.task_id), chosen.provider), entered)

    def _bind(self, c: Candidate, job_id: str) -> None:
        data = self.ops.data
        self.mutate(
            Mutation(
                command="tui reconcile bind",
                title=f"Bind job {job_id} to task {c.task_id}",
                lines=[
                    f"task {c.task_id} ({c.task_status}{', parked' if c.parked else ''}), sent to {c.provider} "
                    f"{c.sent_at:%m-%d %H:%M:%S}",
                    f"its attempt {c.attempt_id} takes job {job_id}; the task goes on from the job's state",
                    f"{c.provider} is asked for the job first: one it does not know, one another attempt holds or",
                    "one made for another request is refused, and nothing changes",
                ],
                run=lambda op: data.bind_job(c.task_id, job_id, op),
                args={"task": str(c.task_id), "job_id": job_id},
            )
        )

    def action_not_created(self) -> None:
        c = self.current()
        if c is None:
            return
        data = self.ops.data
        self.mutate(
            Mutation(
                command="tui reconcile not-created",
                title=f"Declare task {c.task_id}'s job never created",
                lines=[
                    f"task {c.task_id} ({c.task_status}{', parked' if c.parked else ''}), sent to {c.provider} "
                    f"{c.sent_at:%m-%d %H:%M:%S}",
                    f"its attempt {c.attempt_id} is closed as never created (FAILED_BEFORE_ACCEPT): a new attempt",
                    "follows, or the credits are released, as after a lookup that found nothing",
                    "refused while the send may still be in flight (the refusal says from when it is allowed)",
                ],
                run=lambda op: data.not_created(c.task_id, op),
                args={"task": str(c.task_id), "not_created": True},
            )
        )
