"""Reference images reach the provider: the pixels of the output show the client's image (issue 10 item 1).

The reference is a structured synthetic image, four quadrants of distinct colours. A frame from the middle of the
proxy MP4 must show each colour in its quadrant (allowing for the slow zoom/pan and the caption band), two frames
apart must differ (the clip moves), and the same check must fail on a generation without the reference — which
is what the engine produced before references were wired, and what no plumbing-level test noticed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

W, H = 640, 360
QUADRANTS = {  # frame-relative window centres → the reference's colour there
    (0.25, 0.25): (0xD0, 0x20, 0x20),
    (0.75, 0.25): (0x20, 0xC0, 0x20),
    (0.25, 0.70): (0x20, 0x40, 0xE0),
    (0.75, 0.70): (0xE0, 0xD0, 0x20),
}
MAX_DISTANCE = 40.0  # RGB Euclidean; yuv420 + x264 round trips of flat colours land within ~10


def quadrant_png(path: Path) -> Path:
    colors = [f"0x{r:02x}{g:02x}{b:02x}" for r, g, b in QUADRANTS.values()]
    inputs = [arg for c in colors for arg in ("-f", "lavfi", "-i", f"color=c={c}:s=320x180")]
    subprocess.run(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-y",
            *inputs,
            "-filter_complex",
            "[0][1][2][3]xstack=inputs=4:layout=0_0|w0_0|0_h0|w0_h0",
            "-frames:v",
            "1",
            str(path),
        ],
        check=True,
    )
    return path


def frame_at(video: Path, seconds: float) -> bytes:
    out = subprocess.run(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-ss",
            f"{seconds}",
            "-i",
            str(video),
            "-frames:v",
            "1",
            "-vf",
            f"scale={W}:{H}",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
        check=True,
        capture_output=True,
    ).stdout
    assert len(out) == W * H * 3
    return out


def mean_rgb(frame: bytes, cx: float, cy: float, half: float = 0.06) -> tuple[float, float, float]:
    x0, x1 = int((cx - half) * W), int((cx + half) * W)
    y0, y1 = int((cy - half) * H), int((cy + half) * H)
    sums, n = [0, 0, 0], 0
    for y in range(y0, y1):
        row = frame[(y * W + x0) * 3 : (y * W + x1) * 3]
        for c in range(3):
            sums[c] += sum(row[c::3])
        n += x1 - x0
    return (sums[0] / n, sums[1] / n, sums[2] / n)


def distances(frame: bytes) -> list[float]:
    return [math.dist(mean_rgb(frame, cx, cy), want) for (cx, cy), want in QUADRANTS.items()]


def _generate(data: Path, *args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "aivedio_cli",
            "--set",
            f"data_dir={data}",
            "generate",
            "a quadrant test card",
            "--duration",
            "3",
            "--wait",
            "--json",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=data.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert doc["status"] == "SUCCEEDED"
    return doc


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("refs")
    image = quadrant_png(root / "quadrants.png")
    data = root / "data"
    with_ref = _generate(data, "--image", str(image), "--idempotency-key", "with-ref")
    without = _generate(data, "--idempotency-key", "without-ref")
    return {
        "with": Path(with_ref["outputs"]["proxy_mp4"]),  # type: ignore[index]
        "without": Path(without["outputs"]["proxy_mp4"]),
    }  # type: ignore[index]


def test_a_middle_frame_shows_each_quadrant_of_the_reference(renders: dict[str, Path]) -> None:
    found = distances(frame_at(renders["with"], 1.5))
    assert max(found) < MAX_DISTANCE, found


def test_the_clip_moves_over_the_reference(renders: dict[str, Path]) -> None:
    a, b = frame_at(renders["with"], 1.0), frame_at(renders["with"], 2.0)
    changed = sum(1 for x, y in zip(a, b, strict=True) if abs(x - y) > 24) / len(a)
    assert changed > 0.002, f"only {changed:.4%} of the samples changed between t=1 s and t=2 s"


def test_the_same_check_fails_without_the_reference(renders: dict[str, Path]) -> None:
    found = distances(frame_at(renders["without"], 1.5))
    assert max(found) > 2 * MAX_DISTANCE, found
