"""The thumbnail drawn with characters: each cell is the upper half block "▀" coloured with two pixels (the
foreground the upper one, the background the lower one), so a W×H cell box shows W×2H pixels in any terminal
with true colour (tmux, ssh) — no image protocol needed."""

from __future__ import annotations

from rich.color import Color
from rich.style import Style
from rich.text import Text

from aivedio_engine.media.preview import Pixels

#: the preview's width in cells; a terminal cell is about twice as tall as wide, which the half blocks undo
PREVIEW_COLUMNS = 48


def preview_box(width: int | None, height: int | None, columns: int = PREVIEW_COLUMNS) -> tuple[int, int]:
    """(pixel columns, pixel rows) for a `columns`-cell-wide preview of a width×height image (rows even)."""
    if not width or not height:
        return columns, columns * 9 // 16 // 2 * 2
    rows = max(2, round(columns * height / width))
    return columns, rows + rows % 2


def half_blocks(pixels: Pixels) -> Text:
    text = Text()
    for y in range(0, pixels.height - 1, 2):
        for x in range(pixels.width):
            top, bottom = pixels.at(x, y), pixels.at(x, y + 1)
            text.append("▀", Style(color=Color.from_rgb(*top), bgcolor=Color.from_rgb(*bottom)))
        text.append("\n")
    text.rstrip()
    return text
