"""What reviewers and on-call asked of the dashboard (issue 15): the review card shows the prompt and the
thumbnail drawn in the terminal, `o` hands out a signed playback link, every overview count drills down to the
list behind it, `:` takes an id prefix, and a database without tables shows one friendly screen."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import sqlalchemy as sa
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests.support.seeding import Seeded
from tests.tui.conftest import PROMPTS, drive, make_app, press, rows, type_text
from tests.tui.fixture_data import FixtureData
from tui.app import AivedioApp
from tui.screens.empty import EmptyDatabaseScreen
from tui.screens.overview import OverviewScreen
from tui.screens.replay import ReplayScreen
from tui.screens.review import ReviewScreen
from tui.screens.tasks import TaskDetailScreen, TasksScreen


def test_the_review_card_shows_the_prompt_and_the_thumbnail_and_o_gives_a_signed_link(
    world: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)  # no desktop: `o` must give the link, not start a player
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    fox1 = world.review_item("fox1")
    app, toasts = make_app(world.ctx)
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "3")
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        table = screen.query_one("#review", DataTable)
        table.move_cursor(row=list(rows(table)).index(str(fox1.id)))
        await press(pilot)
        facts = screen.facts[fox1.id]
        assert facts.prompt == PROMPTS["fox1"] and facts.proxy and facts.proxy.endswith(".mp4")
        # the preview is the thumbnail's own pixels: not one flat colour
        assert facts.preview is not None and facts.preview.width == 48
        assert len({facts.preview.at(x, y) for x in range(0, 48, 4) for y in range(0, facts.preview.height, 4)}) > 3
        card = screen.query_one("#review-card").render()
        assert PROMPTS["fox1"] in str(card) and "▀" in str(card)

        await press(pilot, "o")
        link = f"/v1/generations/{world.tasks['fox1']}/player?expires="
        assert len(copied) == 1 and link in copied[0] and "sig=" in copied[0]
        assert link in toasts.text()
        assert link in str(screen.query_one("#review-card").render())

    drive(app, scenario)


def test_every_overview_count_drills_down_to_the_list_behind_it(world: Seeded) -> None:
    world.create("late", "a kite")  # queued: there is a QUEUED count to drill into
    app, _ = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        overview = app.screen
        assert isinstance(overview, OverviewScreen)
        states = overview.query_one("#states", DataTable)
        states.focus()
        states.move_cursor(row=list(rows(states)).index("MANUAL_REVIEW"))
        await press(pilot, "enter")
        tasks = app.screen
        assert isinstance(tasks, TasksScreen) and tasks.filter_text == "status:MANUAL_REVIEW"
        listed = rows(tasks.query_one("#tasks", DataTable))
        assert {str(world.tasks["fox1"]), str(world.tasks["fox2"])} == set(listed)

        await press(pilot, "1")
        figures = overview.query_one("#figures", DataTable)
        figures.focus()
        figures.move_cursor(row=list(rows(figures)).index("queue_depth"))
        await press(pilot, "enter")
        assert app.screen is tasks and tasks.filter_text == "status:QUEUED"
        assert set(rows(tasks.query_one("#tasks", DataTable))) == {str(world.tasks["late"])}

        await press(pilot, "1")
        figures.focus()
        figures.move_cursor(row=list(rows(figures)).index("orphans"))
        await press(pilot, "enter")
        assert isinstance(app.screen, ReplayScreen) and app.screen.kind == "orphans"

        await press(pilot, "1")
        providers = overview.query_one("#providers", DataTable)
        providers.focus()
        providers.move_cursor(row=0, column=0)
        await press(pilot, "enter")
        assert app.screen is tasks and tasks.filter_text == "provider:sim"
        assert set(rows(tasks.query_one("#tasks", DataTable))) == {str(t) for t in world.tasks.values()}  # all at sim

    drive(app, scenario)


def test_colon_opens_a_task_by_the_start_of_its_id(world: Seeded) -> None:
    task_id = str(world.tasks["boat"])
    app, _ = make_app(world.ctx)

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "colon")
        assert isinstance(app.screen, CommandPalette)
        await type_text(pilot, task_id[:-6])  # the UUIDv7 ids of one run share their leading (time) digits
        await press(pilot, "down", "enter")
        detail = app.screen
        assert isinstance(detail, TaskDetailScreen) and str(detail.task_id) == task_id

    drive(app, scenario)


class NoTables(FixtureData):
    """A database nobody migrated: every read says "no such table", until `tables` is set."""

    tables = False

    def overview(self) -> Any:
        if not self.tables:
            raise sa.exc.OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: generation_tasks"))
        return super().overview()


def test_an_unmigrated_database_gets_one_friendly_screen_instead_of_a_toast_per_refresh() -> None:
    data = NoTables()
    app = AivedioApp(data, operator="alice@ops", refresh_s=None)  # type: ignore[arg-type]
    toasts: list[str] = []
    original = app.notify
    app.notify = lambda message, *a, **k: (toasts.append(str(message)), original(message, *a, **k))[1]  # type: ignore[method-assign,func-returns-value]

    async def scenario(pilot: Pilot[Any]) -> None:
        assert isinstance(app.screen, EmptyDatabaseScreen)
        assert "aivedio db upgrade" in str(app.screen.query_one("#empty-text").render())
        overview = app.screen_stack[0]
        assert isinstance(overview, OverviewScreen)
        for _ in range(3):  # refreshes while the screen is up change nothing (and say nothing)
            overview.reload()
            await press(pilot)
        assert [s for s in app.screen_stack if isinstance(s, EmptyDatabaseScreen)] == [app.screen]
        assert toasts == []
        await press(pilot, "r")  # checked again: still nothing, so it comes back
        assert isinstance(app.screen, EmptyDatabaseScreen)
        data.tables = True
        await press(pilot, "r")
        assert app.screen is overview and overview.overview is not None and toasts == []

    drive(app, scenario)
