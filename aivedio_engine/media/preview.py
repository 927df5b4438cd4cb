"""A thumbnail's pixels at a terminal's resolution, for the review screen's character preview.

ffmpeg decodes and scales (the image was written by our own derivative run, so it is a plain JPEG); the
caller turns the RGB bytes into characters. Scaling to a fixed box may distort the aspect ratio: the caller
picks the box from the image's known width and height.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from aivedio_engine.media import ffgraph

#: a thumbnail decodes in milliseconds; a stuck ffmpeg must not hold a screen's worker
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Pixels:
    width: int
    height: int
    #: RGB24, row after row
    rgb: bytes

    def at(self, x: int, y: int) -> tuple[int, int, int]:
        i = (y * self.width + x) * 3
        return self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]


def read_pixels(path: Path, width: int, height: int, ffmpeg_bin: str = "ffmpeg") -> Pixels:
    """`path`'s first frame scaled to `width`x`height`; ValueError when ffmpeg cannot read it."""
    source = ffgraph.Input(f"file:{path.resolve()}", {})
    cmd = [ffmpeg_bin, "-nostdin", "-hide_banner", "-loglevel", "error"]
    argv = ffgraph.pixels_argv(cmd, source, width=width, height=height)
    done = subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, check=False)
    want = width * height * 3
    if done.returncode != 0 or len(done.stdout) < want:
        raise ValueError(f"cannot read {path.name}: {done.stderr.decode(errors='replace').strip()[:200]}")
    return Pixels(width, height, done.stdout[:want])
