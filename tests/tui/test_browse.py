"""Reading screens against a database seeded by real generations: overview, tasks + timeline, ledger, capacity,
and the k9s navigation keys (digits, `:` palette, `?` help, Esc back)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import DataTable

from aivedio_engine.db.tables import generation_tasks
from tests.support.seeding import Seeded
from tests.tui.conftest import (
    OPERATOR,
    drive,
    make_app,
    press,
    rows,
    status_line,
    type_text,
)
from tui.screens.capacity import CapacityScreen
from tui.screens.ledger import LedgerScreen
from tui.screens.overview import OverviewScreen
from tui.screens.replay import ReplayScreen
from tui.screens.review import ReviewScreen
from tui.screens.tasks import TaskDetailScreen, TasksScreen
from tui.widgets import HelpScreen


def test_overview_shows_the_counts_of_the_seeded_work(world: Seeded) -> None:
    world.create("late", "a kite")  # created after the run: waiting for a provider slot, 30 s later
    world.ctx.clock.advance(30)  # type: ignore[attr-defined]
    assert world.task("late").status == "QUEUED"
    app, _ = make_app(world.ctx, refresh_s=3600)  # a timer that never fires by itself during the test

    async def scenario(pilot: Pilot[Any]) -> None:
        screen = app.screen
        assert isinstance(screen, OverviewScreen)
        states = rows(screen.query_one("#states", DataTable))
        assert states == {"MANUAL_REVIEW": ["MANUAL_REVIEW", "2"], "QUEUED": ["QUEUED", "1"]}
        figures = {k: v[1] for k, v in rows(screen.query_one("#figures", DataTable)).items()}
        assert figures["submit_unknown"] == "0" and figures["dead_letters"] == "0" and figures["orphans"] == "0"
        # two held outputs keep their reservation until decided, and the new task reserved its estimate
        assert Decimal(figures["reserved"]) == Decimal(6)
        assert figures["reserved_age"] not in ("-", "0s")
        assert figures["queue_depth"] == "1" and figures["queue_p95"] == "30s"
        providers = rows(screen.query_one("#providers", DataTable))
        assert providers == {"sim": ["sim", "0/50", "0", "0"]}
        assert status_line(app).startswith("3 unfinished tasks")

        # the live refresh: each tick of the interval timer loads in a worker; `f` freezes it, `r` still works
        world.create("later", "a kite again")
        loads = screen.loads
        screen._tick()
        await press(pilot)
        assert screen.loads == loads + 1
        assert sum(int(v[1]) for v in rows(screen.query_one("#states", DataTable)).values()) == 4
        await press(pilot, "f")
        screen._tick()
        await press(pilot)
        assert screen.loads == loads + 1 and "live refresh paused" in status_line(app)
        await press(pilot, "r")
        assert screen.loads == loads + 2

    drive(app, scenario)


def test_tasks_filter_by_status_and_text_open_the_timeline_and_cancel(world: Seeded) -> None:
    app, toasts = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "2")
        screen = app.screen
        assert isinstance(screen, TasksScreen)
        table = screen.query_one("#tasks", DataTable)
        assert set(rows(table)) == {str(t) for t in world.tasks.values()}

        await press(pilot, "slash")
        await type_text(pilot, "status:MANUAL_REVIEW")
        await press(pilot, "enter")
        assert set(rows(table)) == {str(world.tasks["fox1"]), str(world.tasks["fox2"])}
        assert "filter: status:MANUAL_REVIEW" in status_line(app)

        await press(pilot, "slash", "ctrl+u")  # words match status/tenant/provider/model/id, case-insensitively
        await type_text(pilot, "succeeded acme")
        await press(pilot, "enter")
        assert list(rows(table)) == [str(world.tasks["boat"])]

        await press(pilot, "enter")
        detail = app.screen
        assert isinstance(detail, TaskDetailScreen) and detail.task_id == world.tasks["boat"]
        timeline = rows(detail.query_one("#timeline", DataTable))
        kinds = [cells[1] for cells in timeline.values()]
        assert {"state change", "attempt", "ledger", "asset"} <= set(kinds)
        moves = [cells[2] for cells in timeline.values() if cells[1] == "state change"]
        assert moves[-1].startswith("POST_PROCESSING → SUCCEEDED")
        assert "SUCCEEDED" in str(detail.query_one("#task-header").render())

        await press(pilot, "escape")  # back to the list, filter kept
        assert app.screen is screen and list(rows(table)) == [str(world.tasks["boat"])]

        await press(pilot, "slash", "ctrl+u")
        await type_text(pilot, "status:NOPE")
        await press(pilot, "enter")
        assert "load failed" in status_line(app) and "unknown status" in status_line(app)

        # an operator cancel, from the list: confirmation with a reason → TaskOps.cancel → audit row
        late = world.create("late", "a kite")
        await press(pilot, "slash", "ctrl+u")
        await type_text(pilot, "status:QUEUED")
        await press(pilot, "enter")
        assert list(rows(table)) == [str(late)]
        await press(pilot, "x")
        await type_text(pilot, "customer asked")
        await press(pilot, "enter")
        assert world.task("late").status == "CANCELED" and rows(table) == {}
        (audit,) = world.audit_rows("tui tasks cancel")
        assert (audit.actor, audit.reason, audit.outcome, audit.affected_ids) == (
            OPERATOR,
            "customer asked",
            "canceled",
            [str(late)],
        )
        assert f"task {late}: canceled (QUEUED → CANCELED)" in toasts.text()

        # a finished task cannot be canceled: the refusal is shown, nothing is written
        await press(pilot, "slash", "ctrl+u")
        await type_text(pilot, "status:SUCCEEDED")
        await press(pilot, "enter", "x")
        await type_text(pilot, "oops")
        await press(pilot, "enter")
        assert any(s == "error" and "SUCCEEDED: finished" in m for s, m in toasts)
        assert len(world.audit_rows("tui tasks cancel")) == 1

    drive(app, scenario)


def test_ledger_capacity_and_the_k9s_navigation_keys(world: Seeded) -> None:
    app, _ = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "6")
        ledger = app.screen
        assert isinstance(ledger, LedgerScreen)
        (acme,) = rows(ledger.query_one("#balances", DataTable)).values()
        assert acme[0] == "acme" and acme[6] == "yes"  # balance equals the ledger sum
        assert Decimal(acme[2]) == world.balance()
        entries = rows(ledger.query_one("#entries", DataTable))
        assert int(acme[5]) == len(entries)
        assert {cells[1] for cells in entries.values()} >= {"RESERVE", "SETTLE"}

        await press(pilot, "7")
        capacity = app.screen
        assert isinstance(capacity, CapacityScreen) and capacity.report is not None
        assert capacity.report.measured.arrivals == 3
        measured = rows(capacity.query_one("#measured", DataTable))
        assert measured["rate"][2] == "3" and "sim" in rows(capacity.query_one("#slots", DataTable))

        # `:` opens the palette; a screen is found by name or alias
        await press(pilot, "colon")
        assert isinstance(app.screen, CommandPalette)
        await type_text(pilot, "dlq")
        await press(pilot, "down", "enter")  # the palette's search is a worker: `press` waited for its hits
        assert isinstance(app.screen, ReplayScreen)

        # Esc returns to the previously visited screen (the k9s "back"), digits jump anywhere
        await press(pilot, "escape")
        assert isinstance(app.screen, CapacityScreen)
        await press(pilot, "3")
        assert isinstance(app.screen, ReviewScreen)

        # `?` lists this screen's keys and the global ones
        await press(pilot, "question_mark")
        help_screen = app.screen
        assert isinstance(help_screen, HelpScreen)
        own = str(help_screen.query_one("#help-screen-keys").render())
        assert "Approve" in own and "Reject" in own and "Claim" in own and "Filter" in own
        assert "Overview" in str(help_screen.query_one("#help-global-keys").render())
        await press(pilot, "escape")
        assert isinstance(app.screen, ReviewScreen)

        # a task id in the palette opens its timeline
        await press(pilot, "colon")
        await type_text(pilot, str(world.tasks["boat"]))
        await press(pilot, "down", "enter")
        assert isinstance(app.screen, TaskDetailScreen) and app.screen.task_id == world.tasks["boat"]

    drive(app, scenario)
    with world.ctx.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(generation_tasks)).scalar_one() == 3
