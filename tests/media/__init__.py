"""Real media for tests, rendered with ffmpeg's lavfi test sources (argv lists, no shell).

Shared with tests/api: `media_files(dir)` renders every sample once into a directory and returns their paths.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

FFMPEG = ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y"]


def _ffmpeg(*args: str) -> None:
    subprocess.run([*FFMPEG, *args], check=True, capture_output=True, timeout=60)


def media_files(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    p = {
        name: out / name
        for name in (
            "clip.mp4",
            "clip.webm",
            "image.png",
            "bomb.png",
            "five_streams.mp4",
            "truncated.mp4",
            "playlist.mp4",
            "concat.mp4",
            "text.mp4",
        )
    }
    # 1 s, 320x240, 25 fps H.264 + AAC: the "good upload"
    _ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=320x240:rate=25:duration=1",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:duration=1",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        "-shortest",
        str(p["clip.mp4"]),
    )
    _ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=160x120:rate=10:duration=1",
        "-c:v",
        "libvpx-vp9",
        "-deadline",
        "realtime",
        "-b:v",
        "50k",
        str(p["clip.webm"]),
    )
    _ffmpeg("-f", "lavfi", "-i", "testsrc=size=320x240", "-frames:v", "1", str(p["image.png"]))
    # 16 Mpx: twice the 4K pixel budget, yet a ~56 KB file (the decompression-bomb shape)
    _ffmpeg("-f", "lavfi", "-i", "color=c=red:size=4000x4000", "-frames:v", "1", str(p["bomb.png"]))
    _ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=160x120:rate=10:duration=1",
        "-f",
        "lavfi",
        "-i",
        "sine=duration=1",
        "-map",
        "0:v",
        *[a for _ in range(4) for a in ("-map", "1:a")],
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-c:a",
        "aac",
        str(p["five_streams.mp4"]),
    )
    good = p["clip.mp4"].read_bytes()
    p["truncated.mp4"].write_bytes(good[: len(good) // 3])  # ftyp + part of mdat, no moov
    p["playlist.mp4"].write_bytes(hls_playlist("http://127.0.0.1:9/segment.ts"))
    p["concat.mp4"].write_bytes(FFCONCAT)
    p["text.mp4"].write_bytes(TEXT)
    return p


def hls_playlist(target_url: str) -> bytes:
    """An HLS playlist whose segment is `target_url`: the SSRF vector if ffmpeg ever followed it."""
    return (
        f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n{target_url}\n#EXT-X-ENDLIST\n"
    ).encode()


FFCONCAT = b"ffconcat version 1.0\nfile /etc/passwd\n"
TEXT = b"just some text, certainly not a video\n"

_rendered: dict[str, dict[str, Path]] = {}


def shared_media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`media_files` rendered once per test session, whichever module asks first."""
    if "files" not in _rendered:
        _rendered["files"] = media_files(tmp_path_factory.mktemp("media"))
    return _rendered["files"]
