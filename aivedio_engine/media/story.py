"""ffmpeg for the `photo_story` workflow (System B): photo stats, per-shot crops, TTS, a music bed, the final mix.

Like `derive`, the builders here are pure argv lists and every process starts through the sandbox
(`sandbox.run`, with the same prlimit prefix as `derive.run_ffmpeg`). Files are named relative to the job's own
directory and the child runs with that directory as its cwd, so no path ever has to be escaped inside a
filtergraph (`subtitles=subs.srt`, `flite=textfile=shot0.txt`). Inputs other than our own lavfi sources are read
as `file:` with `-protocol_whitelist file`.

`run_capture` returns ffmpeg's stderr, because the measurements (signalstats, blurdetect, ebur128) are printed
there or to a file; failures raise `derive.MediaError` (retryable when the sandbox, not the input, is at fault).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aivedio_engine.media import sandbox
from aivedio_engine.media.derive import MediaError, MediaInterrupted, MediaUnavailable
from aivedio_engine.media.probe import MediaLimits

_HEAD = ["-nostdin", "-hide_banner", "-nostats", "-y"]
#: the frame every shot is rendered at: the `local` provider's 360p at 16:9
FRAME_W, FRAME_H = 640, 360
SAMPLE_RATE = 48000


def _in(name: str) -> list[str]:
    return ["-protocol_whitelist", "file", "-i", f"file:{name}"]


def run_capture(argv: Sequence[str], workdir: Path, limits: MediaLimits, timeout_s: float | None = None) -> str:
    """Run one media command in `workdir` under the sandbox; its stderr text, or MediaError."""
    return _run(argv, workdir, limits, timeout_s).stderr.decode("utf-8", "replace")


def probe_streams(name: str, workdir: Path, limits: MediaLimits, ffprobe: str = "ffprobe") -> dict[str, Any]:
    """ffprobe of a file this workflow made itself (the upload probe's whitelists would refuse its subtitle
    track): format duration and every stream's type, codec and size."""
    argv = [
        ffprobe,
        "-v",
        "error",
        "-protocol_whitelist",
        "file",
        "-show_entries",
        "format=duration:stream=index,codec_type,codec_name,width,height,duration",
        "-of",
        "json",
        f"file:{name}",
    ]
    proc = _run(argv, workdir, limits, 60)
    try:
        doc = json.loads(proc.stdout or b"{}")
    except ValueError as exc:
        raise MediaError(f"ffprobe printed no JSON: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _run(argv: Sequence[str], workdir: Path, limits: MediaLimits, timeout_s: float | None) -> sandbox.Finished:
    timeout = min(timeout_s or limits.timeout_s, limits.timeout_s)
    prefix = sandbox.prefix(sandbox.encoder_cpu_s(timeout), limits.memory_limit_bytes)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    try:
        proc = sandbox.run([*prefix, *argv], timeout_s=timeout, env=env, cwd=str(workdir), workdir=workdir)
    except FileNotFoundError as exc:
        raise MediaUnavailable(f"not runnable: {Path(exc.filename or argv[0]).name}") from None
    except sandbox.Interrupted:
        raise MediaInterrupted(f"{Path(argv[0]).name} not started: the engine is stopping") from None
    text = proc.stderr.decode("utf-8", "replace")
    if proc.returncode == 0:
        return proc
    if proc.ending is sandbox.Ending.INTERRUPTED:
        raise MediaInterrupted(f"{Path(argv[0]).name} {proc.reason}")
    if proc.ending is sandbox.Ending.TIMEOUT:
        raise MediaError(f"{Path(argv[0]).name} timed out after {timeout:g}s", retryable=True)
    last = [line for line in text.splitlines() if line.strip()][-3:]
    # our own generated inputs: a failure here is an engine fault, worth a retry
    raise MediaError(f"{Path(argv[0]).name} failed ({proc.reason}): {' | '.join(last)[:400]}", retryable=True)


@functools.cache
def has_flite(ffmpeg_bin: str = "ffmpeg") -> bool:
    """This ffmpeg was built with libflite (`ffmpeg -filters` lists `flite`)."""
    try:
        out = subprocess.run([ffmpeg_bin, "-hide_banner", "-filters"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(rb"^\s*\S+\s+flite\s", out.stdout, re.M) is not None


def espeak_bin() -> str | None:
    return shutil.which("espeak-ng") or shutil.which("espeak")


# --- photo ---------------------------------------------------------------------------------------------------


def stats_argv(src: str, metadata_file: str, ffmpeg_bin: str = "ffmpeg") -> list[str]:
    """Brightness (signalstats YAVG/YMIN/YMAX) and sharpness (blurdetect) of one image, printed to a file."""
    graph = f"format=yuv420p,signalstats,blurdetect,metadata=mode=print:file={metadata_file}"
    return [ffmpeg_bin, *_HEAD, "-loglevel", "error", *_in(src), "-frames:v", "1", "-vf", graph, "-f", "null", "-"]


@dataclass(frozen=True, slots=True)
class ImageStats:
    yavg: float
    ymin: float
    ymax: float
    blur: float | None


def parse_stats(text: str) -> ImageStats:
    def value(name: str) -> float | None:
        m = re.search(rf"lavfi\.{re.escape(name)}=(-?[0-9.]+)", text)
        return float(m.group(1)) if m else None

    yavg, ymin, ymax = value("signalstats.YAVG"), value("signalstats.YMIN"), value("signalstats.YMAX")
    if yavg is None or ymin is None or ymax is None:
        raise MediaError("signalstats printed no values")
    return ImageStats(yavg, ymin, ymax, value("blur"))


@dataclass(frozen=True, slots=True)
class Crop:
    x: int
    y: int
    w: int
    h: int


def shot_crop(width: int, height: int, index: int, shots: int, zoom: float = 0.8) -> Crop:
    """A 16:9 window of the photo, `zoom` of the largest one, sliding from left to right (and up and down) across
    the shots, so each shot shows a different part of the photo."""
    full_w = min(width, height * 16 / 9)
    w = max(2, int(full_w * zoom) // 2 * 2)
    h = max(2, int(w * 9 / 16) // 2 * 2)
    f = index / (shots - 1) if shots > 1 else 0.5
    g = 0.35 + 0.3 * ((index % 2) if shots > 1 else 0.5)
    return Crop(int((width - w) * f), int((height - h) * g), w, h)


def crop_argv(src: str, dst: str, crop: Crop, ffmpeg_bin: str = "ffmpeg") -> list[str]:
    graph = f"crop={crop.w}:{crop.h}:{crop.x}:{crop.y},scale={FRAME_W}:{FRAME_H}:flags=lanczos,setsar=1"
    return [ffmpeg_bin, *_HEAD, "-loglevel", "error", *_in(src), "-frames:v", "1", "-vf", graph, f"file:{dst}"]


# --- audio ---------------------------------------------------------------------------------------------------


def flite_argv(text_file: str, dst: str, ffmpeg_bin: str = "ffmpeg") -> list[str]:
    return [
        ffmpeg_bin,
        *_HEAD,
        "-loglevel",
        "error",
        "-f",
        "lavfi",
        "-i",
        f"flite=textfile={text_file}:voice=slt",
        "-ar",
        str(SAMPLE_RATE),
        "-ac",
        "1",
        f"file:{dst}",
    ]


def espeak_argv(espeak: str, text_file: str, dst: str) -> list[str]:
    return [espeak, "-v", "en-us", "-s", "160", "-f", text_file, "-w", dst]


def narration_argv(
    speech: Sequence[str], durations: Sequence[float], dst: str, ffmpeg_bin: str = "ffmpeg"
) -> list[str]:
    """Each shot's speech padded with silence (or cut) to its shot's length, then joined: the narration track."""
    inputs: list[str] = []
    parts = []
    for i, (name, d) in enumerate(zip(speech, durations, strict=True)):
        inputs += _in(name)
        parts.append(
            f"[{i}:a]aresample={SAMPLE_RATE},aformat=channel_layouts=mono,apad=whole_dur={d:.3f},atrim=0:{d:.3f}[s{i}]"
        )
    joined = "".join(f"[s{i}]" for i in range(len(speech)))
    graph = ";".join([*parts, f"{joined}concat=n={len(speech)}:v=0:a=1[out]"])
    return [ffmpeg_bin, *_HEAD, "-loglevel", "error", *inputs, "-filter_complex", graph, "-map", "[out]", f"file:{dst}"]


def music_argv(duration_s: float, seed: int, dst: str, ffmpeg_bin: str = "ffmpeg") -> list[str]:
    """A soft generated bed: two sine tones a fifth apart (the root from `seed`), some pink noise, a slow tremolo,
    faded in and out."""
    root = (110, 130.81, 146.83, 164.81)[seed % 4]
    d = f"{duration_s:.3f}"
    fade = min(1.0, duration_s / 4)
    graph = (
        "[0:a][1:a][2:a]amix=inputs=3:normalize=0,lowpass=f=1800,tremolo=f=0.5:d=0.3,volume=0.25,"
        f"afade=t=in:d={fade:.2f},afade=t=out:st={max(0.0, duration_s - fade):.3f}:d={fade:.2f}[out]"
    )
    return [
        ffmpeg_bin,
        *_HEAD,
        "-loglevel",
        "error",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency={root}:sample_rate={SAMPLE_RATE}:duration={d}",
        "-f",
        "lavfi",
        "-i",
        f"sine=frequency={root * 1.5:.2f}:sample_rate={SAMPLE_RATE}:duration={d}",
        "-f",
        "lavfi",
        "-i",
        f"anoisesrc=color=pink:amplitude=0.05:sample_rate={SAMPLE_RATE}:duration={d}:seed={seed}",
        "-filter_complex",
        graph,
        "-map",
        "[out]",
        "-ac",
        "1",
        f"file:{dst}",
    ]


# --- composition and QC --------------------------------------------------------------------------------------


def compose_argv(
    clips: Sequence[str],
    voice: str,
    music: str,
    srt: str,
    dst: str,
    duration_s: float,
    *,
    burn: bool = False,
    ffmpeg_bin: str = "ffmpeg",
) -> list[str]:
    """Clips joined (each scaled to the frame, 25 fps), the subtitles as a soft mov_text track (and burned in
    with `burn`: off by default, because the `local` provider already draws each shot's line as its caption),
    the music ducked under the narration (sidechaincompress keyed by the voice), mixed and
    normalised to -16 LUFS; H.264 + AAC in a fast-start MP4."""
    inputs: list[str] = []
    for c in clips:
        inputs += _in(c)
    n = len(clips)
    v_in, m_in, s_in = n, n + 1, n + 2
    inputs += _in(voice) + _in(music) + _in(srt)
    norm = [f"[{i}:v]scale={FRAME_W}:{FRAME_H},setsar=1,fps=25,format=yuv420p[c{i}]" for i in range(n)]
    video = "".join(f"[c{i}]" for i in range(n)) + f"concat=n={n}:v=1:a=0"
    video += f",subtitles={srt}:force_style='FontSize=20,Outline=2'[v]" if burn else "[v]"
    audio = (
        f"[{v_in}:a]aresample={SAMPLE_RATE},asplit=2[vo][key];"
        f"[{m_in}:a]aresample={SAMPLE_RATE}[bed];"
        "[bed][key]sidechaincompress=threshold=0.02:ratio=12:attack=15:release=350[duck];"
        "[vo][duck]amix=inputs=2:duration=first:normalize=0,"
        f"loudnorm=I=-16:TP=-1.5:LRA=11,aresample={SAMPLE_RATE},aformat=channel_layouts=stereo[a]"
    )
    graph = ";".join([*norm, video, audio])
    return [
        ffmpeg_bin,
        *_HEAD,
        "-loglevel",
        "error",
        *inputs,
        "-filter_complex",
        graph,
        "-map",
        "[v]",
        "-map",
        "[a]",
        "-map",
        f"{s_in}:s",
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-crf",
        "23",
        # two sliced x264 threads: the same bytes on every run (frame threads vary when the box is busy)
        "-threads:v",
        "2",
        "-x264-params",
        "sliced-threads=1",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        "-b:a",
        "128k",
        "-c:s",
        "mov_text",
        "-metadata:s:s:0",
        "language=eng",
        "-t",
        f"{duration_s:.3f}",
        "-map_metadata",
        "-1",
        "-movflags",
        "+faststart",
        f"file:{dst}",
    ]


def loudness_argv(src: str, ffmpeg_bin: str = "ffmpeg") -> list[str]:
    # ebur128 prints its summary at the info level
    return [ffmpeg_bin, *_HEAD, "-loglevel", "info", *_in(src), "-map", "0:a:0", "-af", "ebur128", "-f", "null", "-"]


def parse_loudness(text: str) -> float:
    """Integrated loudness (LUFS) from ebur128's summary."""
    summary = text[text.rfind("Summary:") :] if "Summary:" in text else text
    m = re.search(r"I:\s+(-?[0-9.]+|-inf)\s+LUFS", summary)
    if m is None:
        raise MediaError("ebur128 printed no integrated loudness")
    return float("-inf") if m.group(1) == "-inf" else float(m.group(1))
