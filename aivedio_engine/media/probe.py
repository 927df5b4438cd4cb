"""ffprobe: the sandboxed runner, pure parsing of its JSON, and the media policy gate.

Hardening (verified on Debian ffmpeg 5.1): local files only, passed as `file:<path>`
with `-protocol_whitelist file` (an HLS playlist cannot pull http or nested protocols); a per-family
`-format_whitelist` (refuses hls, concat, image2pipe tricks in a "video"); a decoder whitelist (exotic,
bug-prone decoders are never opened); `-max_pixels` (a 16000² PNG is refused before its 1 GB decode: ffprobe
then reports 0×0, which the gate rejects); `-max_streams`; an argv list, never a shell; a wall-clock timeout;
and, when util-linux `prlimit` exists, address-space / CPU / open-file limits. No ffmpeg call ever sees a URL.

The gate itself is pure (`check_policy`), so hostile ffprobe output can be tested without ffprobe.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aivedio_engine.media import sandbox

if TYPE_CHECKING:
    from aivedio_engine.config import MediaSettings

#: ffprobe demuxer names accepted per declared family (a demuxer name may be a comma list, e.g. "mov,mp4,...")
FORMATS = {"video": ("mov", "mp4", "matroska", "webm"), "image": ("png_pipe", "jpeg_pipe", "webp_pipe")}
#: decoder names ffprobe may open (`-codec_whitelist` matches decoder names, not codec ids)
DECODERS = (
    "h264,hevc,vp8,vp9,libvpx,libvpx-vp9,av1,libdav1d,libaom-av1,mpeg4,"
    "aac,aac_fixed,mp3,mp3float,opus,libopus,vorbis,libvorbis,flac,png,mjpeg,webp"
)
VIDEO_CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "mpeg4"})
AUDIO_CODECS = frozenset({"aac", "mp3", "opus", "vorbis", "flac"})
IMAGE_CODECS = frozenset({"png", "mjpeg", "webp"})
#: stream kinds a video may carry besides video/audio (phone recordings carry timecode/metadata tracks)
PASSIVE_STREAMS = frozenset({"data", "subtitle"})
#: extra demuxer stream headroom, so a file a little over the policy gets a precise reason from the gate
STREAM_HEADROOM = 4

_SHOW = (
    "format=format_name,duration,size,bit_rate,nb_streams"
    ":stream=index,codec_type,codec_name,width,height,r_frame_rate,avg_frame_rate,duration,pix_fmt,"
    "sample_rate,channels"
)
_LOG_PREFIX = re.compile(r"^\s*(\[[^\]]*\]\s*)+")


class ProbeError(Exception):
    """The file could not be probed: its content is at fault (unparseable, refused, over a limit)."""


class ProbeUnavailable(Exception):
    """ffprobe itself is missing or broken: our fault, the upload must not be rejected for it."""


class ProbeInterrupted(ProbeUnavailable):
    """The probe was stopped (this process shutting down, SIGINT/SIGTERM/SIGHUP): retry it, never reject for it."""


@dataclass(frozen=True, slots=True)
class MediaLimits:
    max_pixels: int = 3840 * 2160
    min_fps: float = 1
    max_fps: float = 120
    max_streams: int = 4
    max_duration_s: float = 60
    timeout_s: float = 600
    memory_limit_bytes: int = 2 * 1024 * 1024 * 1024
    #: the job directory holding every file of the run (the sandbox may give it to a uid of its own); None when
    #: the files are spread elsewhere (the run then stays as the engine's user)
    workdir: Path | None = None

    @classmethod
    def from_settings(cls, media: MediaSettings) -> MediaLimits:
        # spelled out, not getattr by name: each setting is visibly read (tests/architecture/test_settings_read.py)
        return cls(
            max_pixels=media.max_pixels,
            min_fps=media.min_fps,
            max_fps=media.max_fps,
            max_streams=media.max_streams,
            max_duration_s=media.max_duration_s,
            timeout_s=media.timeout_s,
            memory_limit_bytes=media.memory_limit_bytes,
        )


@dataclass(frozen=True, slots=True)
class StreamInfo:
    index: int
    codec_type: str
    codec_name: str | None
    width: int | None
    height: int | None
    frame_rate: Fraction | None
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    format_name: str
    duration_s: float | None
    streams: tuple[StreamInfo, ...]
    #: bounded, JSON-safe copy of what ffprobe reported (no tags: they are attacker-controlled text)
    raw: dict[str, Any]

    @property
    def video(self) -> StreamInfo | None:
        return next((s for s in self.streams if s.codec_type == "video"), None)

    @property
    def duration_ms(self) -> int | None:
        return None if self.duration_s is None else int(round(self.duration_s * 1000))


# --- running ---------------------------------------------------------------------------------------------


def ffprobe_argv(path: Path, family: str, limits: MediaLimits, ffprobe: str = "ffprobe") -> list[str]:
    if family not in FORMATS:
        raise ValueError(f"unknown media family {family!r}")
    return [
        ffprobe,
        "-v",
        "error",
        "-hide_banner",
        "-protocol_whitelist",
        "file",
        "-format_whitelist",
        ",".join(FORMATS[family]),
        "-codec_whitelist",
        DECODERS,
        "-max_pixels",
        str(limits.max_pixels),
        "-max_streams",
        str(limits.max_streams + STREAM_HEADROOM),
        "-print_format",
        "json",
        "-show_entries",
        _SHOW,
        "-i",
        f"file:{Path(path).resolve()}",
    ]


def run_ffprobe(path: Path, family: str, limits: MediaLimits, ffprobe: str = "ffprobe") -> dict[str, Any]:
    """ffprobe's JSON for a local file. ProbeError when the content is refused or unreadable; ProbeInterrupted
    when the probe was stopped for a reason that says nothing about the file (shutdown, SIGINT/SIGTERM/SIGHUP)."""
    argv = sandbox.prefix(math.ceil(limits.timeout_s), limits.memory_limit_bytes) + ffprobe_argv(
        path, family, limits, ffprobe
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    try:
        proc = sandbox.run(argv, timeout_s=limits.timeout_s, env=env, workdir=limits.workdir)
    except FileNotFoundError as exc:
        raise ProbeUnavailable(f"ffprobe not runnable: {exc.filename}") from None
    except sandbox.Interrupted:
        raise ProbeInterrupted("probe not started: the engine is stopping") from None
    # who ended it first, the exit status second: ffprobe exits 255 on SIGINT/SIGTERM as on SIGXCPU
    if proc.ending is sandbox.Ending.TIMEOUT:
        raise ProbeError(f"probe timed out after {limits.timeout_s:g}s")
    if proc.ending is sandbox.Ending.INTERRUPTED:
        raise ProbeInterrupted(f"probe {proc.reason}")
    if proc.returncode == 127:  # the loader or prlimit could not start ffprobe at all
        raise ProbeUnavailable(_first_line(proc.stderr, path) or "ffprobe could not be started")
    if proc.returncode != 0:
        if proc.returncode < 0:
            raise ProbeError(f"probe {sandbox.signal_reason(proc.returncode)} (resource limit)")
        raise ProbeError(_first_line(proc.stderr, path) or f"ffprobe failed with exit code {proc.returncode}")
    try:
        doc = json.loads(proc.stdout or b"{}")
    except ValueError:
        raise ProbeError("ffprobe output is not JSON") from None
    if not isinstance(doc, dict):
        raise ProbeError("ffprobe output is not a JSON object")
    return doc


def _first_line(stderr: bytes, path: Path) -> str:
    """The root cause ffprobe logged first, without log prefixes, pointers or our temp path."""
    for raw_line in stderr.decode("utf-8", "replace").splitlines():
        line = _LOG_PREFIX.sub("", raw_line).replace(f"file:{Path(path).resolve()}", "input")
        line = line.replace(str(Path(path).resolve()), "input").strip()
        if line:
            return "".join(c if c.isprintable() else "?" for c in line)[:200]
    return ""


# --- parsing (pure) --------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _int(value: Any) -> int | None:
    out = _num(value)
    return int(out) if out is not None and out == int(out) else None


def _rate(value: Any) -> Fraction | None:
    if not isinstance(value, str) or "/" not in value:
        return None
    num, _, den = value.partition("/")
    n, d = _int(num), _int(den)
    if n is None or d is None or n <= 0 or d <= 0:
        return None
    return Fraction(n, d)


def parse_probe(doc: dict[str, Any]) -> ProbeResult:
    fmt = doc.get("format")
    streams = doc.get("streams")
    if not isinstance(fmt, dict) or not isinstance(streams, list):
        raise ProbeError("no container information")
    infos = []
    for i, s in enumerate(streams):
        if not isinstance(s, dict):
            raise ProbeError("malformed stream entry")
        rate = _rate(s.get("avg_frame_rate")) or _rate(s.get("r_frame_rate"))
        index = _int(s.get("index"))
        infos.append(
            StreamInfo(
                index=i if index is None else index,
                codec_type=str(s.get("codec_type") or "unknown")[:32],
                codec_name=str(s["codec_name"])[:32] if s.get("codec_name") else None,
                width=_int(s.get("width")),
                height=_int(s.get("height")),
                frame_rate=rate,
                duration_s=_num(s.get("duration")),
            )
        )
    duration = _num(fmt.get("duration"))
    if duration is None:
        durations = [s.duration_s for s in infos if s.duration_s is not None]
        duration = max(durations) if durations else None
    raw = {
        "format": {
            k: fmt.get(k)
            for k in ("format_name", "duration", "size", "bit_rate", "nb_streams")
            if isinstance(fmt.get(k), (str, int, float))
        },
        "streams": [
            {k: v for k, v in s.items() if isinstance(v, (str, int, float)) and k != "tags"}
            for s in streams[:16]
            if isinstance(s, dict)
        ],
    }
    return ProbeResult(str(fmt.get("format_name") or "")[:64], duration, tuple(infos), raw)


# --- the gate (pure) -------------------------------------------------------------------------------------


def check_policy(result: ProbeResult, family: str, limits: MediaLimits) -> str | None:
    """The first policy violation, or None when the media is acceptable."""
    names = set(result.format_name.split(","))
    if not names & set(FORMATS.get(family, ())):
        return f"container {result.format_name or 'unknown'!r} is not allowed for {family}"
    if not result.streams:
        return "no streams"
    if len(result.streams) > limits.max_streams:
        return f"{len(result.streams)} streams (limit {limits.max_streams})"
    videos = [s for s in result.streams if s.codec_type == "video"]
    if not videos:
        return "no video stream"
    for v in videos:
        if not v.width or not v.height or v.width <= 0 or v.height <= 0:
            return "picture size unknown or over the pixel limit"
        if v.width * v.height > limits.max_pixels:
            return f"{v.width}x{v.height} exceeds {limits.max_pixels} pixels"
    return _check_image(result) if family == "image" else _check_video(result, videos[0], limits)


def _check_image(result: ProbeResult) -> str | None:
    if len(result.streams) != 1:
        return "an image must have exactly one stream"
    codec = result.streams[0].codec_name
    if codec not in IMAGE_CODECS:
        return f"image codec {codec!r} is not allowed"
    return None


def _check_video(result: ProbeResult, main: StreamInfo, limits: MediaLimits) -> str | None:
    for s in result.streams:
        if s.codec_type == "video" and s.codec_name not in VIDEO_CODECS:
            return f"video codec {s.codec_name!r} is not allowed"
        if s.codec_type == "audio" and s.codec_name not in AUDIO_CODECS:
            return f"audio codec {s.codec_name!r} is not allowed"
        if s.codec_type not in ("video", "audio") and s.codec_type not in PASSIVE_STREAMS:
            return f"stream type {s.codec_type!r} is not allowed"
    fps = main.frame_rate
    if fps is None:
        return "frame rate unknown"
    if not limits.min_fps <= fps <= limits.max_fps:
        return f"frame rate {float(fps):.3g} fps outside [{limits.min_fps:g}, {limits.max_fps:g}]"
    if result.duration_s is None or result.duration_s <= 0:
        return "duration unknown"
    if result.duration_s > limits.max_duration_s:
        return f"duration {result.duration_s:.3f}s exceeds {limits.max_duration_s:g}s"
    return None


def probe_file(path: Path, family: str, limits: MediaLimits, ffprobe: str = "ffprobe") -> ProbeResult:
    """Run ffprobe and the gate; ProbeError with the reason when the media is refused."""
    result = parse_probe(run_ffprobe(path, family, limits, ffprobe))
    reason = check_policy(result, family, limits)
    if reason:
        raise ProbeError(reason)
    return result
