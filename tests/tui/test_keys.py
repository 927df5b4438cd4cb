"""One meaning per key on every screen (tui/keys.py), the digits in the footer, `y` copies a whole id, and an
id prefix in `:` finds the task (the pure parts; the palette itself is driven in test_browse)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from textual.binding import Binding
from textual.pilot import Pilot
from textual.widgets import DataTable, Footer

from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.task_ops import prefix_range
from tests.tui.conftest import settle
from tests.tui.fixture_data import FixtureData
from tui.app import ENTRIES, AivedioApp
from tui.keys import MEANINGS
from tui.screens.base import OpsScreen
from tui.screens.projects import ProjectDetailScreen
from tui.screens.tasks import TaskDetailScreen


def _screens() -> list[type[OpsScreen]]:
    return [e.screen for e in ENTRIES] + [TaskDetailScreen, ProjectDetailScreen]  # type: ignore[misc]


def test_every_screen_binds_each_key_to_its_one_meaning() -> None:
    wrong = []
    for screen in _screens():
        for cls in [c for c in screen.__mro__ if isinstance(c, type) and issubclass(c, OpsScreen)]:
            for b in cls.__dict__.get("BINDINGS", []):
                assert isinstance(b, Binding)
                for key in b.key.split(","):
                    meaning = MEANINGS.get(key)
                    if meaning is None or b.action not in meaning.actions:
                        wrong.append(f"{cls.__name__}: {key} → {b.action}")
    assert wrong == []


def test_k_only_acknowledges_and_p_only_processes_again() -> None:
    assert MEANINGS["k"].actions == {"acknowledge"}
    assert MEANINGS["p"].actions == {"replay", "reconcile", "retry"}


def test_id_prefixes_become_an_index_range() -> None:
    lo, hi = prefix_range("0195a3c0-00")
    assert lo == uuid.UUID("0195a3c0-0000-0000-0000-000000000000")
    assert hi == uuid.UUID("0195a3c0-00ff-ffff-ffff-ffffffffffff")
    full = uuid.UUID("0195a3c0-0001-7000-8000-000000000001")
    assert prefix_range(str(full)) == (full, full)
    for bad in ("", "xyz", "0195 a3", "0" * 33):
        with pytest.raises(InvalidInput):
            prefix_range(bad)


def test_the_footer_shows_the_ten_screen_keys_and_y_copies_a_whole_id() -> None:
    app = AivedioApp(FixtureData(), operator="alice@ops", refresh_s=None)  # type: ignore[arg-type]
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]

    async def scenario(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        shown = {b.binding.key for b in app.screen.active_bindings.values() if b.binding.show}
        assert {e.key for e in ENTRIES} <= shown
        footer = app.screen.query_one(Footer)
        assert footer.display
        await pilot.press("2")
        await settle(pilot)
        table = app.screen.query_one("#tasks", DataTable)
        table.move_cursor(row=2)
        await pilot.press("y")
        await settle(pilot)
        assert copied == ["0195a3c0-0003-7000-8000-000000000003"]

    async def main() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await scenario(pilot)

    import asyncio

    asyncio.run(main())
