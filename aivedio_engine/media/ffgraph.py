"""The one module that imports ffmpeg-python: the client mandates the library, and keeping it here means a
swap (another graph builder, or hand-written argv) touches one file and is checked by one set of argv tests.

Callers (`derive`, `render`) keep every decision: which files, which whitelists and caps, sizes, durations,
seeds. They hand over plain values; this module only spells them as filtergraphs and encoder options and
compiles those to argv lists. Nothing here starts a process, and nothing here reads user text: captions
arrive as a file path, never as filter arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import ffmpeg

_Stream: TypeAlias = ffmpeg.nodes.FilterableStream  # Any to mypy: ffmpeg-python has no type hints


@dataclass(frozen=True, slots=True)
class Input:
    """A local file (`file:<abs path>`) and the input options that fence it in, in command-line order."""

    url: str
    options: Mapping[str, Any]


def _open(source: Input) -> _Stream:
    return ffmpeg.input(source.url, **source.options)


def _compile(out: ffmpeg.nodes.OutputStream, cmd: Sequence[str], overwrite: bool = False) -> list[str]:
    return list(out.compile(cmd=list(cmd), overwrite_output=overwrite))


# --- derivatives (proxy MP4, HLS, thumbnail, waveform) ---------------------------------------------------


def _scaled_short_side(video: _Stream, short: int) -> _Stream:
    # expressions (not sizes from the probe) so ffmpeg's autorotation of phone clips keeps the aspect right;
    # -2 lets scale derive the other side rounded to even, trunc(.../2)*2 evens a source that is left alone
    keep = f"lte(min(iw,ih),{short})"
    width = f"if({keep},trunc(iw/2)*2,if(lte(iw,ih),{short},-2))"
    height = f"if({keep},trunc(ih/2)*2,if(lte(iw,ih),-2,{short}))"
    return video.filter("scale", w=width, h=height)


def _av_options(audio: bool) -> dict[str, Any]:
    # metadata and chapters dropped: attacker-controlled tags (or a phone's GPS) never reach what we serve
    options: dict[str, Any] = {
        "c:v": "libx264",
        "preset": "veryfast",
        "crf": 23,
        "pix_fmt": "yuv420p",
        "profile:v": "high",
        "map_metadata": -1,
        "map_chapters": -1,
        "fflags": "+bitexact",
        "flags:v": "+bitexact",
    }
    if audio:
        options.update({"c:a": "aac", "b:a": "128k", "ac": 2, "flags:a": "+bitexact"})
    else:
        options["an"] = None
    return options


def _av_streams(source: Input, short_side: int, audio: bool) -> list[_Stream]:
    stream = _open(source)
    # explicit first-video/first-audio selection: extra audio, data or subtitle tracks are never copied
    video = _scaled_short_side(stream["v:0"], short_side).filter("format", "yuv420p")
    return [video, stream["a:0"]] if audio else [video]


def proxy_mp4_argv(
    cmd: Sequence[str], source: Input, dst: str, *, short_side: int, audio: bool, keyframe_every_s: int
) -> list[str]:
    """H.264/AAC MP4 scaled to `short_side` (never up), moov first so a browser starts playing at once, with a
    keyframe every `keyframe_every_s` so HLS can be cut from it without encoding a second time."""
    out = ffmpeg.output(
        *_av_streams(source, short_side, audio),
        dst,
        format="mp4",
        movflags="+faststart",
        force_key_frames=f"expr:gte(t,n_forced*{keyframe_every_s})",
        **_av_options(audio),
    )
    return _compile(out, cmd)


def hls_remux_argv(
    cmd: Sequence[str],
    source: Input,
    playlist: str,
    *,
    segment_pattern: str,
    init_name: str,
    segment_s: int,
    audio: bool,
) -> list[str]:
    """The same VOD HLS as `hls_argv`, cut from an H.264/AAC proxy whose keyframes already sit on the segment
    boundaries: streams are copied, not encoded (a remux costs a small fraction of an encode)."""
    stream = _open(source)
    streams = [stream["v:0"], stream["a:0"]] if audio else [stream["v:0"]]
    out = ffmpeg.output(
        *streams,
        playlist,
        format="hls",
        hls_segment_type="fmp4",
        hls_time=segment_s,
        hls_playlist_type="vod",
        hls_flags="independent_segments",
        hls_fmp4_init_filename=init_name,
        hls_segment_filename=segment_pattern,
        c="copy",
        map_metadata=-1,
        map_chapters=-1,
        fflags="+bitexact",
    )
    return _compile(out, cmd)


def hls_argv(
    cmd: Sequence[str],
    source: Input,
    playlist: str,
    *,
    segment_pattern: str,
    init_name: str,
    segment_s: int,
    short_side: int,
    audio: bool,
) -> list[str]:
    """VOD HLS with fMP4 segments (`segment_pattern`) and an init segment named relatively in the playlist."""
    out = ffmpeg.output(
        *_av_streams(source, short_side, audio),
        playlist,
        format="hls",
        hls_segment_type="fmp4",
        hls_time=segment_s,
        hls_playlist_type="vod",
        hls_flags="independent_segments",
        hls_fmp4_init_filename=init_name,
        hls_segment_filename=segment_pattern,
        # a keyframe on every segment boundary, or segments drift to whatever GOP x264 picked
        force_key_frames=f"expr:gte(t,n_forced*{segment_s})",
        **_av_options(audio),
    )
    return _compile(out, cmd)


def thumbnail_argv(cmd: Sequence[str], source: Input, dst: str, *, max_width: int) -> list[str]:
    """One JPEG frame of the first video stream, at most `max_width` wide with even sides."""
    width = f"if(gt(iw,{max_width}),{max_width},trunc(iw/2)*2)"
    video = _open(source)["v:0"].filter("scale", w=width, h=-2)
    out = ffmpeg.output(
        video,
        dst,
        format="image2",
        update=1,
        **{
            "c:v": "mjpeg",
            "frames:v": 1,
            "q:v": 3,
            "map_metadata": -1,
            "map_chapters": -1,
            "fflags": "+bitexact",
            "flags:v": "+bitexact",
        },
    )
    return _compile(out, cmd)


def waveform_argv(cmd: Sequence[str], source: Input, dst: str, *, size: str) -> list[str]:
    """A PNG picture (`size`, WxH) of the first audio stream's waveform."""
    picture = _open(source)["a:0"].filter("showwavespic", s=size)
    out = ffmpeg.output(
        picture,
        dst,
        format="image2",
        update=1,
        **{
            "c:v": "png",
            "frames:v": 1,
            "map_metadata": -1,
            "map_chapters": -1,
            "fflags": "+bitexact",
            "flags:v": "+bitexact",
        },
    )
    return _compile(out, cmd)


# --- the local provider's clips ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PannedImage:
    """A still image, slowly zoomed and panned with zoompan expressions (`zoom`, `x`, `y`) over `frames`."""

    source: Input
    width: int
    height: int
    frames: int
    fps: int
    zoom: str
    x: str
    y: str


@dataclass(frozen=True, slots=True)
class Generated:
    """A lavfi source graph, optionally scaled to `scale_to` (generators that are cheaper drawn small)."""

    graph: str
    scale_to: tuple[int, int] | None = None
    scale_flags: str | None = None


@dataclass(frozen=True, slots=True)
class Tone:
    """A sine tone at `volume` with fade in/out of `fade_s`; `realtime` reads it at its native rate."""

    frequency: int
    duration_s: float
    fade_s: float
    volume: float
    realtime: bool = False


@dataclass(frozen=True, slots=True)
class Caption:
    """Text drawn from `text_file` (never inline: `expansion=none` too, so `%{...}` prints literally)."""

    font_file: str
    text_file: str
    size: int


def _panned_image(p: PannedImage) -> _Stream:
    w, h = p.width, p.height
    # zoompan moves in whole input pixels; working at 2x the output size halves the visible jitter
    return (
        _open(p.source)
        .video.filter("trim", end_frame=1)  # an animated image would otherwise yield n frames per input frame
        .filter("scale", 2 * w, 2 * h, force_original_aspect_ratio="increase")
        .filter("crop", 2 * w, 2 * h)
        .filter("setsar", 1)
        .filter("zoompan", z=p.zoom, x=p.x, y=p.y, d=p.frames, s=f"{w}x{h}", fps=p.fps)
    )


def _generated(g: Generated) -> _Stream:
    video = ffmpeg.input(g.graph, format="lavfi").video
    if g.scale_to is None:
        return video
    w, h = g.scale_to
    if g.scale_flags is None:
        return video.filter("scale", w, h)
    return video.filter("scale", w, h, flags=g.scale_flags)


def _tone(t: Tone) -> _Stream:
    d = f"{t.duration_s:.3f}"
    extra = {"re": None} if t.realtime else {}
    return (
        ffmpeg.input(f"sine=frequency={t.frequency}:sample_rate=44100:duration={d}", format="lavfi", **extra)
        .audio.filter("volume", t.volume)
        .filter("afade", type="in", start_time=0, duration=f"{t.fade_s:.3f}")
        .filter("afade", type="out", start_time=f"{t.duration_s - t.fade_s:.3f}", duration=f"{t.fade_s:.3f}")
    )


def _drawtext(video: _Stream, c: Caption) -> _Stream:
    size = c.size
    return video.filter(
        "drawtext",
        fontfile=c.font_file,
        textfile=c.text_file,
        expansion="none",
        fontsize=size,
        fontcolor="white",
        borderw=max(1, size // 12),
        bordercolor="black@0.8",
        box=1,
        boxcolor="black@0.35",
        boxborderw=max(2, size // 3),
        line_spacing=max(2, size // 4),
        x="(w-text_w)/2",
        y="h-text_h-h/12",
    )


def clip_argv(
    cmd: Sequence[str],
    dst: str,
    video: PannedImage | Generated,
    audio: Tone,
    *,
    caption: Caption | None,
    duration_s: float,
    fade_s: float,
    fps: int,
    preset: str,
    threads: int,
) -> list[str]:
    """An H.264/AAC MP4 (bitexact, faststart) of `video` with fades and an optional caption, over `audio`."""
    stream = _panned_image(video) if isinstance(video, PannedImage) else _generated(video)
    stream = (
        stream.filter("format", "yuv420p")
        .filter("fade", type="in", start_time=0, duration=f"{fade_s:.3f}")
        .filter("fade", type="out", start_time=f"{duration_s - fade_s:.3f}", duration=f"{fade_s:.3f}")
    )
    if caption is not None:
        stream = _drawtext(stream, caption)
    out = ffmpeg.output(
        stream,
        _tone(audio),
        dst,
        format="mp4",
        vcodec="libx264",
        preset=preset,
        pix_fmt="yuv420p",
        r=fps,
        g=fps * 2,
        acodec="aac",
        audio_bitrate="96k",
        ac=1,
        ar=44100,
        t=f"{duration_s:.3f}",
        movflags="+faststart",
        map_metadata=-1,
        fflags="+bitexact",
        threads=threads,
        **{"flags:v": "+bitexact", "flags:a": "+bitexact"},
    )
    return _compile(out, cmd, overwrite=True)
