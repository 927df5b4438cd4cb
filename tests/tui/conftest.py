"""Driving the dashboard in tests: a seeded database (real generations, tests/support/seeding.py), the app run
headless with `App.run_test()`, and waiting on workers instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from tests.support.seeding import Seeded, seed
from tests.support.sim import SimHandle
from tui.app import AivedioApp
from tui.data import EngineData

OPERATOR = "alice@tui-test"
#: two outputs held for review (the prompt names the review term), one that succeeds outright
PROMPTS = {"fox1": "a red fox at dawn", "fox2": "a fox in the snow", "boat": "a paper boat"}
SIZE = (150, 42)


class Toasts(list[tuple[str, str]]):
    """(severity, message) of every notification the app showed."""

    def text(self) -> str:
        return "\n".join(m for _, m in self)


def make_app(
    ctx: Any, *, readonly: bool = False, refresh_s: float | None = None, image_protocol: Any = None
) -> tuple[AivedioApp, Toasts]:
    app = AivedioApp(
        EngineData(ctx), readonly=readonly, operator=OPERATOR, refresh_s=refresh_s, image_protocol=image_protocol
    )
    toasts = Toasts()
    original = app.notify

    def notify(message: str, *args: Any, **kwargs: Any) -> None:
        toasts.append((kwargs.get("severity", "information"), str(message)))
        original(message, *args, **kwargs)

    app.notify = notify  # type: ignore[method-assign]
    return app, toasts


async def settle(pilot: Pilot[Any]) -> None:
    """Until no worker runs: a load may start another (a mutation's refresh, a card's facts)."""
    app = pilot.app
    for _ in range(100):
        await pilot.pause()
        busy = [w for w in app.workers if not w.is_finished]
        if not busy:
            return
        await app.workers.wait_for_complete(busy)
    raise AssertionError(f"workers still running: {list(app.workers)}")


async def press(pilot: Pilot[Any], *keys: str) -> None:
    await pilot.press(*keys)
    await settle(pilot)


async def type_text(pilot: Pilot[Any], text: str) -> None:
    """Type into the focused input at once (a key press per character costs a screen refresh each)."""
    focused = pilot.app.focused
    assert isinstance(focused, Input), f"typing needs a focused Input, not {focused!r}"
    focused.insert_text_at_cursor(text)
    await settle(pilot)


def drive(app: AivedioApp, scenario: Callable[[Pilot[Any]], Awaitable[None]], size: tuple[int, int] = SIZE) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            await scenario(pilot)

    asyncio.run(main())


def rows(table: DataTable[Any]) -> dict[str, list[Any]]:
    return {str(key.value): table.get_row(key) for key in table.rows}


def status_line(app: AivedioApp) -> str:
    return str(app.screen.query_one("#status-line").render())


@pytest.fixture
def world(tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeded]:
    """The three PROMPTS run through the whole pipeline on embedded SQLite."""
    seeded = seed(tmp_path, sim, None, monkeypatch, PROMPTS)
    yield seeded
    seeded.ctx.close()
