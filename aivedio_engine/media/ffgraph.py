"""The one module that imports ffmpeg-python: the client mandates the library, and keeping it here means a
swap (another graph builder, or hand-written argv) touches one file and is checked by one set of argv tests.

Callers (`derive`, `render`) keep every decision: which files, which whitelists and caps, sizes, durations,
seeds. They hand over plain values; this module only spells them as filtergraphs and encoder options and
compiles those to argv lists. Nothing here starts a process, and nothing here reads user text: captions
arrive as a file path, never as filter arguments.
"""

from __future__ import annotations

import re
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


@dataclass(frozen=True, slots=True)
class Hls:
    """Where a VOD HLS rendition goes: the playlist, its fMP4 segments (`segment_pattern`, e.g. `seg_%03d.m4s`)
    and the init segment it names relatively, cut every `segment_s` seconds."""

    playlist: str
    segment_pattern: str
    init_name: str
    segment_s: int


@dataclass(frozen=True, slots=True)
class Outputs:
    """What one combined run writes (None: not wanted). The proxy and the HLS share one H.264/AAC encode."""

    proxy: str | None
    hls: Hls | None
    thumbnail: str | None
    #: seconds into the (capped) input at which the thumbnail frame is taken
    thumbnail_at: str
    waveform: str | None


_STRIPPED = {"map_metadata": -1, "map_chapters": -1, "fflags": "+bitexact"}


def x264_threads(threads: int) -> dict[str, Any]:
    """x264 options for `threads` encoder threads with output that is the same bytes on every run.

    x264's frame threads (its default, `threads` auto included) make slightly different bitstreams from run to
    run when the machine is busy; seen here: 4 of 60 combined runs under load. Sliced threads split each frame
    into one slice per thread and are bit-exact for a fixed count, which is spelled here so the bytes do not
    depend on the machine's number of cores either.
    """
    return {"threads:v": threads, "x264-params": "sliced-threads=1"}


#: encoder threads for derivatives: two keeps a 2-core worker busy without oversubscribing it
DERIVATIVE_X264_THREADS = 2
#: the AAC encoder's nominal rate; a remux restates it so the HLS boxes match those of a direct encode
AUDIO_BITRATE = "128k"


def _scaled_short_side(video: _Stream, short: int) -> _Stream:
    # expressions (not sizes from the probe) so ffmpeg's autorotation of phone clips keeps the aspect right;
    # -2 lets scale derive the other side rounded to even, trunc(.../2)*2 evens a source that is left alone
    keep = f"lte(min(iw,ih),{short})"
    width = f"if({keep},trunc(iw/2)*2,if(lte(iw,ih),{short},-2))"
    height = f"if({keep},trunc(ih/2)*2,if(lte(iw,ih),-2,{short}))"
    return video.filter("scale", w=width, h=height)


def _av_options(audio: bool, keyframe_every_s: int, global_header: bool = False) -> dict[str, Any]:
    # metadata and chapters dropped: attacker-controlled tags (or a phone's GPS) never reach what we serve.
    # A keyframe on every segment boundary, or HLS segments drift to whatever GOP x264 picked.
    flags = "+bitexact+global_header" if global_header else "+bitexact"
    options: dict[str, Any] = {
        "c:v": "libx264",
        "preset": "veryfast",
        "crf": 23,
        "pix_fmt": "yuv420p",
        "profile:v": "high",
        "force_key_frames": f"expr:gte(t,n_forced*{keyframe_every_s})",
        **x264_threads(DERIVATIVE_X264_THREADS),
        **_STRIPPED,
        "flags:v": flags,
    }
    if audio:
        options.update({"c:a": "aac", "b:a": AUDIO_BITRATE, "ac": 2, "flags:a": flags})
    else:
        options["an"] = None
    return options


def _av_streams(stream: _Stream, short_side: int, audio: bool, video: _Stream | None = None) -> list[_Stream]:
    # explicit first-video/first-audio selection: extra audio, data or subtitle tracks are never copied
    video = _scaled_short_side(stream["v:0"] if video is None else video, short_side).filter("format", "yuv420p")
    return [video, stream["a:0"]] if audio else [video]


def _mp4_options() -> dict[str, Any]:
    # moov first so a browser starts playing at once
    return {"format": "mp4", "movflags": "+faststart"}


def _hls_options(hls: Hls) -> dict[str, Any]:
    return {
        "format": "hls",
        "hls_segment_type": "fmp4",
        "hls_time": hls.segment_s,
        "hls_playlist_type": "vod",
        "hls_flags": "independent_segments",
        "hls_fmp4_init_filename": hls.init_name,
        "hls_segment_filename": hls.segment_pattern,
    }


def _thumbnail(video: _Stream, dst: str, max_width: int, **extra: Any) -> ffmpeg.nodes.OutputStream:
    width = f"if(gt(iw,{max_width}),{max_width},trunc(iw/2)*2)"
    options = {"c:v": "mjpeg", "frames:v": 1, "q:v": 3, **_STRIPPED, "flags:v": "+bitexact", **extra}
    return ffmpeg.output(video.filter("scale", w=width, h=-2), dst, format="image2", update=1, **options)


def _waveform(audio: _Stream, dst: str, size: str) -> ffmpeg.nodes.OutputStream:
    options = {"c:v": "png", "frames:v": 1, **_STRIPPED, "flags:v": "+bitexact"}
    return ffmpeg.output(audio.filter("showwavespic", s=size), dst, format="image2", update=1, **options)


def proxy_mp4_argv(
    cmd: Sequence[str], source: Input, dst: str, *, short_side: int, audio: bool, keyframe_every_s: int
) -> list[str]:
    """H.264/AAC MP4 scaled to `short_side` (never up), moov first, with a keyframe every `keyframe_every_s` so
    HLS can be cut from it without encoding a second time."""
    streams = _av_streams(_open(source), short_side, audio)
    return _compile(ffmpeg.output(*streams, dst, **_mp4_options(), **_av_options(audio, keyframe_every_s)), cmd)


def hls_remux_argv(cmd: Sequence[str], source: Input, hls: Hls, *, audio: bool) -> list[str]:
    """The same VOD HLS as `hls_argv`, cut from an H.264/AAC proxy whose keyframes already sit on the segment
    boundaries: streams are copied, not encoded (a remux costs a small fraction of an encode).

    The playlist and segments equal those of a combined run (`derivatives_argv`); so does the init segment,
    because the remux restates what the encoder told the muxer there: the encoder's name (the proxy's own
    video tags, which are ours) and its nominal bitrates (none for CRF video) instead of measured ones."""
    stream = _open(source)
    streams = [stream["v:0"], stream["a:0"]] if audio else [stream["v:0"]]
    nominal = {"b:v": 0, **({"b:a": AUDIO_BITRATE} if audio else {})}
    out = ffmpeg.output(
        *streams,
        hls.playlist,
        c="copy",
        **_hls_options(hls),
        **_STRIPPED,
        **{"map_metadata:s:v:0": "0:s:v:0"},
        **nominal,
    )
    return _compile(out, cmd)


def hls_argv(cmd: Sequence[str], source: Input, hls: Hls, *, short_side: int, audio: bool) -> list[str]:
    """VOD HLS with fMP4 segments and an init segment named relatively in the playlist, encoded from `source`."""
    streams = _av_streams(_open(source), short_side, audio)
    return _compile(
        ffmpeg.output(*streams, hls.playlist, **_hls_options(hls), **_av_options(audio, hls.segment_s)), cmd
    )


def thumbnail_argv(cmd: Sequence[str], source: Input, dst: str, *, max_width: int) -> list[str]:
    """One JPEG frame of the first video stream, at most `max_width` wide with even sides."""
    return _compile(_thumbnail(_open(source)["v:0"], dst, max_width), cmd)


def waveform_argv(cmd: Sequence[str], source: Input, dst: str, *, size: str) -> list[str]:
    """A PNG picture (`size`, WxH) of the first audio stream's waveform."""
    return _compile(_waveform(_open(source)["a:0"], dst, size), cmd)


def derivatives_argv(
    cmd: Sequence[str],
    source: Input,
    outputs: Outputs,
    *,
    short_side: int,
    audio: bool,
    keyframe_every_s: int,
    max_width: int,
    waveform_size: str,
) -> list[str]:
    """Every wanted derivative from one decode of `source`, as outputs of one filtergraph: the video is split
    between the H.264 encode and the thumbnail, the audio goes to the AAC encode and to the waveform. The proxy
    and the HLS take the same encoded packets through the tee muxer, so the video is encoded once; each output
    gets the options of its own single-profile argv, which is what keeps the bytes the same as theirs."""
    stream = _open(source)
    encoded = outputs.proxy is not None or outputs.hls is not None
    wanted = [encoded, outputs.thumbnail is not None]
    split = stream["v:0"].split() if all(wanted) else None
    branches = iter([split[0], split[1]] if split is not None else [stream["v:0"]])
    nodes: list[ffmpeg.nodes.OutputStream] = []
    if encoded:
        streams = _av_streams(stream, short_side, audio, video=next(branches))
        if outputs.proxy is not None and outputs.hls is not None:
            # the tee muxer is not MP4: ask the encoders for out-of-band headers as the MP4 and HLS muxers
            # would, or x264 repeats SPS/PPS in-band and the bytes differ from a single-profile run
            slaves = "|".join(
                [_tee_slave(_mp4_options(), outputs.proxy), _tee_slave(_hls_options(outputs.hls), outputs.hls.playlist)]
            )
            options = {"format": "tee", **_av_options(audio, keyframe_every_s, global_header=True)}
            nodes.append(ffmpeg.output(*streams, slaves, **options))
        elif outputs.proxy is not None:
            nodes.append(
                ffmpeg.output(*streams, outputs.proxy, **_mp4_options(), **_av_options(audio, keyframe_every_s))
            )
        else:
            assert outputs.hls is not None
            hls_options = {**_hls_options(outputs.hls), **_av_options(audio, keyframe_every_s)}
            nodes.append(ffmpeg.output(*streams, outputs.hls.playlist, **hls_options))
    if outputs.thumbnail is not None:
        # an output seek: the frame is the same one an input seek picks, and the decode is shared
        nodes.append(_thumbnail(next(branches), outputs.thumbnail, max_width, ss=outputs.thumbnail_at))
    if outputs.waveform is not None:
        nodes.append(_waveform(stream["a:0"], outputs.waveform, waveform_size))
    if not nodes:
        raise ValueError("no derivative wanted")
    return _compile(ffmpeg.merge_outputs(*nodes), cmd)


_TEE_PLAIN = re.compile(r"[^A-Za-z0-9/_.%+-]")


def _tee_escape(text: str) -> str:
    # backslash before anything else: tee unescapes once when splitting slaves and once more for option values
    return _TEE_PLAIN.sub(lambda m: "\\" + m.group(0), text)


def _tee_slave(options: Mapping[str, Any], url: str) -> str:
    """One tee slave, `[f=fmt:opt=value:...]url`. onfail=abort: a slave that fails fails the run (the caller then
    builds each profile on its own, so the failure is recorded against the right one)."""
    muxer = {("f" if k == "format" else k): v for k, v in options.items()}
    spec = ":".join(f"{k}={_tee_escape(str(v))}" for k, v in {**muxer, "onfail": "abort"}.items())
    return _tee_escape(f"[{spec}]{url}")


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
        **x264_threads(threads),
        **{"flags:v": "+bitexact", "flags:a": "+bitexact"},
    )
    return _compile(out, cmd, overwrite=True)


def pixels_argv(cmd: Sequence[str], source: Input, *, width: int, height: int) -> list[str]:
    """The first frame scaled to exactly `width`x`height`, as raw RGB24 on stdout (a terminal preview)."""
    scaled = _open(source)["v:0"].filter("scale", w=width, h=height)
    return _compile(ffmpeg.output(scaled, "pipe:", format="rawvideo", pix_fmt="rgb24", **{"frames:v": 1}), cmd)
