"""Derivatives of a validated upload or render: proxy MP4, fMP4 HLS, thumbnail and waveform.

The argv builders are pure: this module decides what to read and make, and `ffgraph` (the only module that
may use ffmpeg-python) spells it as a graph and compiles the argv; `run_ffmpeg` is the one place a process starts.
Every input is a local file read as `file:<abs path>` with `-protocol_whitelist file` and the same demuxer,
decoder, pixel and stream whitelists the probe used, so a file that changed between probe and transcode (or
that fooled the probe) still cannot make ffmpeg open a URL or an exotic decoder. Reading is capped at
min(probe duration, max_duration_s): a container that lies about its duration cannot make us encode for hours.
Metadata and chapters are dropped, so attacker-controlled tags (or a phone's GPS) never reach what we serve.

All wanted profiles come out of one ffmpeg run (one decode, one encode shared by the proxy and the HLS), with
each output's bytes equal to those its own single-profile run makes. When that run fails, every profile is
built again on its own, so one failing output marks only that derivative FAILED. Partial output of a failed
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
_PROXY = DerivativeProfile.PROXY_MP4
_FILE_NAMES = {
    DerivativeProfile.PROXY_MP4: "proxy.mp4",
    DerivativeProfile.THUMBNAIL: "thumbnail.jpg",
    DerivativeProfile.WAVEFORM: "waveform.png",
}

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


def _hls(out_dir: Path) -> ffgraph.Hls:
    out_dir = Path(out_dir).resolve()
    return ffgraph.Hls(_out(out_dir / HLS_PLAYLIST), _out(out_dir / HLS_SEGMENT_PATTERN), HLS_INIT, HLS_SEGMENT_S)


def hls_from_proxy_argv(
    proxy: Path, out_dir: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """HLS cut from our own proxy MP4 (built by `proxy_mp4_argv` from the source `probe` describes): the same
    input fences as for any file, streams copied."""
    return ffgraph.hls_remux_argv(_cmd(ffmpeg_bin), _input(proxy, probe, limits), _hls(out_dir), audio=has_audio(probe))


def hls_argv(
    src: Path, out_dir: Path, probe: ProbeResult, limits: MediaLimits, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """VOD HLS with fMP4 segments next to `index.m3u8`; the playlist names its files relatively."""
    return ffgraph.hls_argv(
        _cmd(ffmpeg_bin), _input(src, probe, limits), _hls(out_dir), short_side=PROXY_SHORT_SIDE, audio=has_audio(probe)
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


def output_dir(workdir: Path, profile: DerivativeProfile) -> Path:
    return Path(workdir) / profile.value


def _file(workdir: Path, profile: DerivativeProfile) -> Path:
    return output_dir(workdir, profile) / _FILE_NAMES[profile]


def combined_argv(
    src: Path,
    workdir: Path,
    probe: ProbeResult,
    limits: MediaLimits,
    profiles: Sequence[DerivativeProfile],
    ffmpeg_bin: str = "ffmpeg",
) -> list[str]:
    """Every profile of `profiles` in one ffmpeg run, each into `output_dir(workdir, profile)`: one decode, one
    H.264/AAC encode for the proxy and the HLS, and for each output the same options (so the same bytes) as its
    own argv above."""
    wanted = set(profiles)
    if DerivativeProfile.WAVEFORM in wanted and not has_audio(probe):
        raise ValueError("the source has no audio stream")

    def file_of(profile: DerivativeProfile) -> str | None:
        return _out(_file(workdir, profile)) if profile in wanted else None

    outputs = ffgraph.Outputs(
        proxy=file_of(DerivativeProfile.PROXY_MP4),
        hls=_hls(output_dir(workdir, DerivativeProfile.HLS)) if DerivativeProfile.HLS in wanted else None,
        thumbnail=file_of(DerivativeProfile.THUMBNAIL),
        thumbnail_at=_seconds(thumbnail_at(probe, limits)),
        waveform=file_of(DerivativeProfile.WAVEFORM),
    )
    return ffgraph.derivatives_argv(
        _cmd(ffmpeg_bin),
        _input(src, probe, limits),
        outputs,
        short_side=PROXY_SHORT_SIDE,
        audio=has_audio(probe),
        keyframe_every_s=HLS_SEGMENT_S,
        max_width=THUMBNAIL_MAX_WIDTH,
        waveform_size=WAVEFORM_SIZE,
    )


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
        proc = sandbox.run([*prefix, *argv], timeout_s=limits.timeout_s, env=env, workdir=limits.workdir)
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
    if proc.returncode < 0:  # a kernel limit's signal, or our temp-disk watchdog ("killed: temp disk over …")
        raise MediaError(f"ffmpeg {proc.reason} (resource limit)")
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
    """Each requested profile into its own subdirectory of `workdir` (`output_dir`).

    Several profiles are built by one ffmpeg run (`combined_argv`): each process start costs about as much CPU
    as a short clip's whole encode. When that run fails, nothing of it is kept and every profile is built again
    on its own, so a failure is recorded against the profile it belongs to and the others are still made."""
    # config lists profiles as strings; the enum also rejects a typo before any work starts. The proxy goes
    # first: built on their own, HLS is then cut from it instead of being encoded a second time.
    wanted = sorted(dict.fromkeys(DerivativeProfile(p) for p in profiles), key=lambda p: p is not _PROXY)
    skipped: dict[DerivativeProfile, DerivativeResult] = {
        p: DerivativeResult(p, "SKIPPED", error="no audio stream")
        for p in wanted
        if p is DerivativeProfile.WAVEFORM and not has_audio(probe)
    }
    buildable = [p for p in wanted if p not in skipped]
    built = _build_together(Path(src), probe, Path(workdir), buildable, limits) if len(buildable) > 1 else None
    if built is None:
        built = _build_each(Path(src), probe, Path(workdir), buildable, limits)
    return {p: skipped.get(p) or built[p] for p in wanted}


def _build_together(
    src: Path, probe: ProbeResult, workdir: Path, profiles: Sequence[DerivativeProfile], limits: MediaLimits
) -> dict[DerivativeProfile, DerivativeResult] | None:
    """All `profiles` from one run, or None when it failed (the caller then builds them one by one)."""
    try:
        for profile in profiles:
            output_dir(workdir, profile).mkdir(parents=True, exist_ok=True)
        run_ffmpeg(combined_argv(src, workdir, probe, limits, profiles), limits, hide=(src,))
        # ffmpeg drops a tee output whose spec it cannot parse and still exits 0: every output is checked here
        return {p: _collect(p, output_dir(workdir, p)) for p in profiles}
    except MediaInterrupted as exc:  # the engine is stopping: starting the single runs would be refused too
        _remove(workdir, profiles)
        # reported as the one-by-one path reports it: the first one stopped, the others never built
        return {p: _failed(p, exc) if i == 0 else _not_built(p, exc.message) for i, p in enumerate(profiles)}
    except (MediaError, ValueError, OSError):
        _remove(workdir, profiles)
        return None


def _build_each(
    src: Path, probe: ProbeResult, workdir: Path, profiles: Sequence[DerivativeProfile], limits: MediaLimits
) -> dict[DerivativeProfile, DerivativeResult]:
    results: dict[DerivativeProfile, DerivativeResult] = {}
    interrupted: str | None = None
    for profile in profiles:
        out_dir = output_dir(workdir, profile)
        if interrupted is not None:  # the engine is stopping: starting the next encode would be refused too
            results[profile] = _not_built(profile, interrupted)
            continue
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            results[profile] = _build(profile, src, probe, out_dir, limits, results)
        except (MediaError, ValueError, OSError) as exc:
            _remove(workdir, [profile])  # never upload what a failed run left behind
            results[profile] = _failed(profile, exc)
            if isinstance(exc, MediaInterrupted):
                interrupted = exc.message
    return results


def _failed(profile: DerivativeProfile, exc: Exception) -> DerivativeResult:
    # a full or unwritable work disk is ours to fix, so it is worth another attempt
    retryable = exc.retryable if isinstance(exc, MediaError) else isinstance(exc, OSError)
    message = exc.message if isinstance(exc, MediaError) else _os_message(exc)
    return DerivativeResult(
        profile, "FAILED", error=message, retryable=retryable, interrupted=isinstance(exc, MediaInterrupted)
    )


def _not_built(profile: DerivativeProfile, interrupted: str) -> DerivativeResult:
    return DerivativeResult(profile, "FAILED", error=f"not built: {interrupted}", retryable=True, interrupted=True)


def _remove(workdir: Path, profiles: Sequence[DerivativeProfile]) -> None:
    for profile in profiles:
        shutil.rmtree(output_dir(workdir, profile), ignore_errors=True)


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
        proxy = built.get(_PROXY)
        if proxy is not None and proxy.status == "READY":
            run_ffmpeg(hls_from_proxy_argv(proxy.main or proxy.files[0], out_dir, probe, limits), limits, hide=(src,))
        else:  # no proxy to cut from (not wanted, or it failed): encode from the source
            run_ffmpeg(hls_argv(src, out_dir, probe, limits), limits, hide=(src,))
    else:
        builder = {
            _PROXY: proxy_mp4_argv,
            DerivativeProfile.THUMBNAIL: thumbnail_argv,
            DerivativeProfile.WAVEFORM: waveform_argv,
        }[profile]
        run_ffmpeg(builder(src, out_dir / _FILE_NAMES[profile], probe, limits), limits, hide=(src,))
    return _collect(profile, out_dir)


def _collect(profile: DerivativeProfile, out_dir: Path) -> DerivativeResult:
    files = _hls_files(out_dir) if profile is DerivativeProfile.HLS else [out_dir / _FILE_NAMES[profile]]
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
