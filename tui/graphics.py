"""Thumbnails as real images where the terminal can show them: sixel, or the kitty graphics protocol (TGP),
through textual-image; every other terminal (and pipes, and headless tests) keeps the half-block preview
(tui/preview.py).

textual-image asks the terminal what it supports when it is first imported, and that only works before Textual
takes the terminal over: `detect()` runs in `tui.app.run` before the app starts, and the app is told the answer
(tests tell it one instead, so the choice is testable without a terminal that draws images)."""

from __future__ import annotations

from typing import Literal

from textual.widget import Widget

from tui.preview import PREVIEW_COLUMNS

ImageProtocol = Literal["sixel", "tgp"]


def detect() -> ImageProtocol | None:
    """The protocol this terminal draws images with, or None (no terminal, or neither protocol answered)."""
    try:
        import textual_image.widget  # noqa: F401 - the import queries the terminal and caches its cell size
        from textual_image.renderable import Image, SixelImage, TGPImage
    except Exception:  # noqa: BLE001 - no image support is never a reason not to start
        return None
    if Image is SixelImage:
        return "sixel"
    if Image is TGPImage:
        return "tgp"
    return None


def image_widget(protocol: ImageProtocol, path: str) -> Widget:
    """textual-image's widget for `protocol` showing the image file at `path`, as wide as the block preview."""
    from textual_image.widget import SixelImage, TGPImage

    widget: Widget = SixelImage(path) if protocol == "sixel" else TGPImage(path)
    widget.styles.width = PREVIEW_COLUMNS
    widget.styles.height = "auto"
    return widget
