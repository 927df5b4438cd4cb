"""Derivatives of a validated upload or render (DESIGN §10): proxy MP4, fMP4 HLS, thumbnail and waveform.

The argv builders are pure: this module decides what to read and make, and `ffgraph` (the only module that
may use ffmpeg-python) spells it as a graph and compiles the argv; `run_ffmpeg` is the one place a process starts.
Every input is a local file read as `file:<abs path>` with `-protocol_whitelist file` and the same demuxer,
decoder, pixel and stream whitelists the probe used, so a file that changed between probe and transcode (or
that fooled the probe) still cannot make ffmpeg open a URL or an exotic decoder. Reading is capped at
min(probe duration, max_duration_s): a container that lies about its duration cannot make us encode for hours.
Metadata and chapters are dropped, so attacker-controlled tags (or a phone's GPS) never reach what we serve.

Each profile runs on its own: one failing encode marks only that derivative FAILED. Partial output of a failed
run is deleted, so the uploader only ever sees complete files.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aivedio_engine.domain.status import DerivativeProfile
from aivedio_engine.media import ffgraph, sandbox
from aivedio_engine.media.probe import DECODERS, FORMATS, STREAM_HEADROOM, MediaLimits, ProbeResult
from aivedio_engine.media.render import error_summary

#: short side of the proxy and the HLS rendition; 720p plays everywhere and keeps review uploads small
PROXY_SHORT_SIDE = 720
THUMBNAIL_MAX_WIDTH = 640
WAVEFORM_SIZE = "1280x240"
HLS_SEGMENT_S = 2
HLS_PLAYLIST = "index.m3u8"
HLS_INIT = "init.mp4"
HLS_SEGMENT_PATTERN = "seg_%03d.m4s"

CONTENT_TYPES = {
    ".mp4": "video/mp4",
    ".m3u8": "application/vnd.apple.mpegurl",
    ".m4s": "video/iso.segment",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
}

Status = Literal["READY", "FAILED", "SKIPPED"]

_HEAD = ["-nostdin", "-hide_banner", "-nostats", "-loglevel", "error", "-y"]
_LOG_PREFIX = re.compile(r"^\s*(\[[^\]]*\]\s*)+")
#: ffmpeg exits 255 when a signal it handles arrives; when we did not stop it, under our sandbox that is
#: prlimit's SIGXCPU (our own stops are told apart by `sandbox.Child`, which records them)
_SIGNALLED_EXIT = 255
#: how an address-space cap shows up: ENOMEM text, x264's failed malloc, or EAGAIN from thread creation
_ENOMEM_MARKERS = (
    b"Cannot allocate memory",
    b"out of memory",
    b"Out of memory",
    b"malloc of size",
    b"Resource temporarily unavailable",
)


class MediaError(Exception):
    """An ffmpeg run failed. `retryable` is False when the content (or its cost) is at fault."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class MediaUnavailable(MediaError):
    """ffmpeg is missing or cannot start: our fault, so the job must be retried rather than failed."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class MediaInterrupted(MediaUnavailable):
    """ffmpeg was stopped (this process shutting down, SIGINT/SIGTERM/SIGHUP): retry, never a rejection."""


@dataclass(slots=True)
class DerivativeResult:
    profile: DerivativeProfile
    status: Status
    #: upload order: for HLS the playlist first, then the init segment and the media segments
    files: list[Path] = field(default_factory=list)
    #: the file a player opens (the playlist for HLS)
    main: Path | None = None
    content_type: str | None = None
    error: str | None = None
    retryable: bool = False
    #: stopped, not failed (MediaInterrupted): the whole job is retried soon
    interrupted: bool = False


def content_type_for(path: Path) -> str:
    return CONTENT_TYPES.get(Path(path).suffix.lower(), "application/octet-stream")


# --- argv builders (pure) --------------------------------------------------------------------------------


def duration_cap(probe: ProbeResult, limits: MediaLimits) -> float:
    """Seconds of input to read: the probed duration, never more than the policy allows."""
    d = probe.duration_s
    if d is None or not math.isfinite(d) or d <= 0:
        return float(limits.max_duration_s)
    return min(d, float(limits.max_duration_s))


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def has_audio(probe: ProbeResult) -> bool:
    return any(s.codec_type == "audio" for s in probe.streams)


def _input(src: Path, probe: ProbeResult, limits: MediaLimits, **options: Any) -> ffgraph.Input:
    if probe.video is None:
        raise ValueError("the source has no video stream")
    return ffgraph.Input(
        _out(src),
        {
            "protocol_whitelist": "file",
            "format_whitelist": ",".join(FORMATS["video"]),
            "codec_whitelist": DECODERS,
            "max_pixels": limits.max_pixels,
            "max_streams": limits.max_streams + STREAM_HEADROOM,
            "t": _seconds(duration_cap(probe, limits)),
            **options,
        },
    )


def _out(path: Path) -> str:
    # the `file:` prefix stops a colon in a path from being read as a protocol name
    return f"file:{Path(path).resolve()}"


def _cmd(ffmpeg_bin: str) -> list[str]:
    return [ffmpeg_bin, *_HEAD]


def proxy_mp4_argv(
    src: Path, dst: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """H.264/AAC MP4, short side ≤ 720 (never upscaled), moov first so a browser starts playing at once."""
    return ffgraph.proxy_mp4_argv(
        _cmd(ffmpeg_bin),
        _input(src, probe, limits),
        _out(dst),
        short_side=PROXY_SHORT_SIDE,
        audio=has_audio(probe),
        keyframe_every_s=HLS_SEGMENT_S,
    )


def hls_from_proxy_argv(
    proxy: Path, out_dir: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """HLS cut from our own proxy MP4 (built by `proxy_mp4_argv` from the source `probe` describes): the same
    input fences as for any file, streams copied."""
    out_dir = Path(out_dir).resolve()
    return ffgraph.hls_remux_argv(
        _cmd(ffmpeg_bin),
        _input(proxy, probe, limits),
        _out(out_dir / HLS_PLAYLIST),
        segment_pattern=_out(out_dir / HLS_SEGMENT_PATTERN),
        init_name=HLS_INIT,
        segment_s=HLS_SEGMENT_S,
        audio=has_audio(probe),
    )


def hls_argv(
    src: Path, out_dir: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """VOD HLS with fMP4 segments next to `index.m3u8`; the playlist names its files relatively."""
    out_dir = Path(out_dir).resolve()
    return ffgraph.hls_argv(
        _cmd(ffmpeg_bin),
        _input(src, probe, limits),
        _out(out_dir / HLS_PLAYLIST),
        segment_pattern=_out(out_dir / HLS_SEGMENT_PATTERN),
        init_name=HLS_INIT,
        segment_s=HLS_SEGMENT_S,
        short_side=PROXY_SHORT_SIDE,
        audio=has_audio(probe),
    )


def thumbnail_at(probe: ProbeResult, limits: MediaLimits) -> float:
    # one second in skips fade-ins and black leaders; half the clip when it is shorter than two seconds
    return min(1.0, duration_cap(probe, limits) / 2)


def thumbnail_argv(
    src: Path, dst: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """One JPEG frame, at most 640 wide with even sides."""
    source = _input(src, probe, limits, ss=_seconds(thumbnail_at(probe, limits)))
    return ffgraph.thumbnail_argv(_cmd(ffmpeg_bin), source, _out(dst), max_width=THUMBNAIL_MAX_WIDTH)


def waveform_argv(
    src: Path, dst: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """A PNG picture of the first audio stream's waveform."""
    if not has_audio(probe):
        raise ValueError("the source has no audio stream")
    return ffgraph.waveform_argv(_cmd(ffmpeg_bin), _input(src, probe, limits), _out(dst), size=WAVEFORM_SIZE)


# --- running ---------------------------------------------------------------------------------------------


def _file_args(argv: Sequence[str]) -> list[Path]:
    """Local paths named in the argv (files first, then their directories), to keep them out of messages."""
    files = [Path(a[len("file:") :]) for a in argv if a.startswith("file:")]
    dirs = {f.parent for f in files}
    return files + sorted(dirs, key=lambda d: len(str(d)), reverse=True)


def _summary(stderr: bytes, hide: Sequence[Path]) -> str:
    lines = [_LOG_PREFIX.sub("", line) for line in stderr.decode("utf-8", "replace").splitlines()]
    return error_summary("\n".join(lines).encode(), hide=tuple(hide))


def run_ffmpeg(argv: Sequence[str], limits: MediaLimits, hide: Sequence[Path] = ()) -> None:
    """Run one ffmpeg argv under the sandbox limits; MediaError (classified) when it does not succeed."""
    prefix = sandbox.prefix(sandbox.encoder_cpu_s(limits.timeout_s), limits.memory_limit_bytes)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    try:
        proc = sandbox.run([*prefix, *argv], timeout_s=limits.timeout_s, env=env)
    except FileNotFoundError as exc:
        raise MediaUnavailable(f"ffmpeg not runnable: {Path(exc.filename or argv[0]).name}") from None
    except sandbox.Interrupted:
        raise MediaInterrupted("ffmpeg not started: the engine is stopping") from None
    if proc.returncode == 0:
        return
    # who ended it first: ffmpeg exits 255 on the SIGINT/SIGTERM of a shutdown exactly as on SIGXCPU
    if proc.ending is sandbox.Ending.TIMEOUT:
        raise MediaError(f"ffmpeg timed out after {limits.timeout_s:g}s")
    if proc.ending is sandbox.Ending.INTERRUPTED:
        raise MediaInterrupted(f"ffmpeg {proc.reason}")
    stderr = proc.stderr
    hidden = [*hide, *_file_args(argv)]
    if proc.returncode == 127:  # prlimit or the loader could not start ffmpeg (also: memory cap below its libraries)
        named = stderr.replace(argv[0].encode(), Path(argv[0]).name.encode())
        raise MediaUnavailable(f"ffmpeg could not be started: {_summary(named, hidden) or 'exit code 127'}")
    if proc.returncode < 0:
        raise MediaError(f"ffmpeg {sandbox.signal_reason(proc.returncode)} (resource limit)")
    if proc.returncode == _SIGNALLED_EXIT:  # nobody here stopped it, so the signal it trapped was a limit's
        raise MediaError("ffmpeg stopped by a signal (resource limit)")
    if any(marker in stderr for marker in _ENOMEM_MARKERS):
        raise MediaError("ffmpeg ran out of memory (resource limit)")
    message = _summary(stderr, hidden)
    raise MediaError(message or f"ffmpeg failed with exit code {proc.returncode}")


# --- derivatives -----------------------------------------------------------------------------------------


@contextmanager
def job_dir(base: Path | None = None) -> Iterator[Path]:
    """A fresh private directory for one job, removed however the job ends."""
    path = Path(tempfile.mkdtemp(prefix="aivedio-media-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def build_derivatives(
    src: Path, probe: ProbeResult, workdir: Path, profiles: Sequence[DerivativeProfile], limits: MediaLimits
) -> dict[DerivativeProfile, DerivativeResult]:
    """Each requested profile, built independently into its own subdirectory of `workdir`."""
    results: dict[DerivativeProfile, DerivativeResult] = {}
    # config lists profiles as strings; the enum also rejects a typo before any work starts. The proxy goes
    # first: HLS is then cut from it instead of being encoded a second time.
    wanted = dict.fromkeys(DerivativeProfile(p) for p in profiles)
    interrupted: str | None = None
    for profile in sorted(wanted, key=lambda p: p is not DerivativeProfile.PROXY_MP4):
        out_dir = Path(workdir) / profile.value
        if profile is DerivativeProfile.WAVEFORM and not has_audio(probe):
            results[profile] = DerivativeResult(profile, "SKIPPED", error="no audio stream")
            continue
        if interrupted is not None:  # the engine is stopping: starting the next encode would be refused too
            results[profile] = DerivativeResult(
                profile, "FAILED", error=f"not built: {interrupted}", retryable=True, interrupted=True
            )
            continue
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            results[profile] = _build(profile, Path(src), probe, out_dir, limits, results)
        except (MediaError, ValueError, OSError) as exc:
            shutil.rmtree(out_dir, ignore_errors=True)  # never upload what a failed run left behind
            # a full or unwritable work disk is ours to fix, so it is worth another attempt
            retryable = exc.retryable if isinstance(exc, MediaError) else isinstance(exc, OSError)
            message = exc.message if isinstance(exc, MediaError) else _os_message(exc)
            results[profile] = DerivativeResult(
                profile, "FAILED", error=message, retryable=retryable, interrupted=isinstance(exc, MediaInterrupted)
            )
            if isinstance(exc, MediaInterrupted):
                interrupted = exc.message
    return results


def _os_message(exc: Exception) -> str:
    # OSError text carries the path; the errno name is what an operator needs
    if isinstance(exc, OSError):
        return f"local I/O error: {os.strerror(exc.errno) if exc.errno else type(exc).__name__}"
    return str(exc)


def _build(
    profile: DerivativeProfile,
    src: Path,
    probe: ProbeResult,
    out_dir: Path,
    limits: MediaLimits,
    built: dict[DerivativeProfile, DerivativeResult],
) -> DerivativeResult:
    if profile is DerivativeProfile.HLS:
        proxy = built.get(DerivativeProfile.PROXY_MP4)
        if proxy is not None and proxy.status == "READY":
            run_ffmpeg(hls_from_proxy_argv(proxy.main or proxy.files[0], out_dir, probe, limits), limits, hide=(src,))
        else:  # no proxy to cut from (not wanted, or it failed): encode from the source
            run_ffmpeg(hls_argv(src, out_dir, probe, limits), limits, hide=(src,))
        files = _hls_files(out_dir)
    else:
        name, builder = {
            DerivativeProfile.PROXY_MP4: ("proxy.mp4", proxy_mp4_argv),
            DerivativeProfile.THUMBNAIL: ("thumbnail.jpg", thumbnail_argv),
            DerivativeProfile.WAVEFORM: ("waveform.png", waveform_argv),
        }[profile]
        dst = out_dir / name
        run_ffmpeg(builder(src, dst, probe, limits), limits, hide=(src,))
        files = [dst]
    # ffmpeg exits 0 when there was nothing to encode (e.g. a seek past a lying end): that is not a derivative
    for path in files:
        if not path.is_file() or path.stat().st_size == 0:
            raise MediaError(f"{profile.value} produced no output")
    return DerivativeResult(profile, "READY", files=files, main=files[0], content_type=content_type_for(files[0]))


def _hls_files(out_dir: Path) -> list[Path]:
    """Playlist, init segment, media segments; every name the playlist uses must be a plain file beside it."""
    playlist = out_dir / HLS_PLAYLIST
    if not playlist.is_file():
        raise MediaError("hls produced no playlist")
    names: list[str] = []
    for line in playlist.read_text("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("#EXT-X-MAP:"):
            match = re.search(r'URI="([^"]*)"', line)
            names.append(match.group(1) if match else "")
        elif line and not line.startswith("#"):
            names.append(line)
    if not names or not any(n.endswith(".m4s") for n in names):
        raise MediaError("hls playlist lists no segments")
    for name in names:
        if not name or Path(name).name != name or ":" in name:
            raise MediaError("hls playlist names a non-relative segment")
    return [playlist, *(out_dir / n for n in dict.fromkeys(names))]
