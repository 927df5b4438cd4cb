"""The review card's thumbnail: textual-image's widget where the terminal draws images (sixel or the kitty
graphics protocol), the half-block preview everywhere else. The terminal's answer is injected (a headless test
has no terminal to ask); the widget itself is textual-image's own, mounted and rendered by the app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.containers import Vertical
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests.support.seeding import Seeded
from tests.tui.conftest import drive, make_app, press, rows
from tui.screens.review import ReviewScreen

HALF_BLOCK = "▀"


def _card_and_thumb(world: Seeded, protocol: str | None) -> tuple[str, list[Any], Any]:
    fox1 = world.review_item("fox1")
    app, _ = make_app(world.ctx, image_protocol=protocol)
    seen: dict[str, Any] = {}

    async def scenario(pilot: Pilot[Any]) -> None:
        await press(pilot, "3")
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        table = screen.query_one("#review", DataTable)
        table.move_cursor(row=list(rows(table)).index(str(fox1.id)))
        await press(pilot)  # (settles the card's worker)
        await press(pilot)  # (and the image's mount)
        seen["card"] = str(screen.query_one("#review-card").render())
        box = screen.query_one("#review-thumb", Vertical)
        seen["thumb"] = list(box.children) if box.display else []
        seen["facts"] = screen.facts[fox1.id]

    drive(app, scenario)
    return seen["card"], seen["thumb"], seen["facts"]


def test_a_terminal_without_image_support_gets_the_block_preview(world: Seeded) -> None:
    card, thumb, facts = _card_and_thumb(world, None)
    assert facts.preview is not None and HALF_BLOCK in card
    assert thumb == []


@pytest.mark.parametrize("protocol", ["sixel", "tgp"])
def test_a_terminal_that_draws_images_gets_textual_image(world: Seeded, protocol: str) -> None:
    from textual_image.widget import SixelImage, TGPImage

    card, thumb, facts = _card_and_thumb(world, protocol)
    assert HALF_BLOCK not in card and "thumbnail" in card  # the facts stay; the blocks give way to the image
    (image,) = thumb
    assert isinstance(image, SixelImage if protocol == "sixel" else TGPImage)
    assert facts.thumbnail_file and Path(facts.thumbnail_file).is_file()
    assert str(image.image) == facts.thumbnail_file
