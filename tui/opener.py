"""`o` on the review screen: the proxy MP4 in the system player when this terminal runs on a desktop, else a
signed playback URL (the player page of `aivedio serve`) that a reviewer opens on any machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping


def can_open_locally(env: Mapping[str, str] | None = None) -> bool:
    """A display to show a player on, and xdg-open to pick it (over ssh or in a container there is neither)."""
    env = os.environ if env is None else env
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")) and shutil.which("xdg-open") is not None


def open_locally(path: str) -> None:
    """Hand `path` to the desktop's player, detached: the player outlives nothing of ours and never writes
    into the TUI's terminal."""
    opener = shutil.which("xdg-open")
    if opener is None:
        raise OSError("xdg-open is not installed")
    subprocess.Popen(
        [opener, path],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
