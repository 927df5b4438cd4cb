"""Small helpers for the end-to-end tests: a real reference image and ffprobe's verdict on an output."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def sample_png(path: Path, size: str = "320x240") -> Path:
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=s={size}", "-frames:v", "1", str(path)],
        check=True,
        timeout=30,
    )
    return path


def ffprobe_duration(path: Path | str, *, network: bool = False) -> float:
    """Duration ffprobe reads from a local file or (network=True) a loopback URL; for an HLS playlist its
    segments are read too, so a playlist whose segment links do not work fails here."""
    protocols = "file,http,tcp" if network else "file"
    proc = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-protocol_whitelist",
            protocols,
            "-show_entries",
            "format=duration:stream=codec_name",
            "-of",
            "json",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(proc.stdout)
    codecs = {s.get("codec_name") for s in doc.get("streams", [])}
    assert "h264" in codecs, f"{path.name}: no H.264 stream ({codecs})"
    return float(doc["format"]["duration"])
